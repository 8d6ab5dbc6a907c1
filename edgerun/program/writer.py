"""Write a program file: header, canonical JSON graph section, then the weights in aligned segments.

The weights are hashed in one pass (their digests go into the segment table, which the header checksum
covers) and streamed to the file in a second, so saving never holds a second copy of the model in memory.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import flat_constant_specs, flat_constants
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import canonical_json_bytes
from edgerun.program.document import Metadata, decode_document, encode_document
from edgerun.program.format import (
    CHECKSUM_OFFSET,
    CHECKSUM_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAX_GRAPH_SECTION_BYTES,
    STATIC_FORMAT_MINOR,
    Header,
    align_up,
)
from edgerun.program.program_parts import DEFAULT_METHOD, ProgramParts, state_segment_name
from edgerun.program.segment_table import SegmentEntry
from edgerun.program.string_segment import encode_strings

_ZEROS = bytes(4096)


@dataclass(frozen=True)
class PreparedWeight:
    """A constant ready to write: contiguous, little-endian, with its digest."""

    name: str
    array: np.ndarray  # what the segment holds: the values, or a string constant's encoded bytes
    dtype: DType
    sha256: str
    shape: tuple[int, ...]  # the constant's shape (a string constant's `array` is its flat bytes)


def prepare_weights(graph: Graph) -> list[PreparedWeight]:
    prepared = []
    specs = flat_constant_specs(graph)
    for name, value in flat_constants(graph).items():  # bodies' constants under qualified names
        array = np.asarray(value)
        try:
            dtype = DType.of(array)
        except ValueError as e:
            raise ProgramFormatError(f"constant {name!r}: {e}") from None
        spec = specs.get(name)
        if spec != TensorSpec(array.shape, dtype):
            raise ProgramFormatError(f"constant {name!r} is {dtype.value}{list(array.shape)} but its spec is {spec}")
        shape = tuple(array.shape)
        if dtype is DType.string:  # length-prefixed UTF-8 (string_segment.py)
            array = encode_strings(array, f"constant {name!r}")
        else:  # astype rather than ascontiguousarray: the latter turns 0-d arrays into shape (1,).
            array = array.astype(dtype.np.newbyteorder("<"), order="C", copy=False)
        digest = hashlib.sha256(_raw_bytes(array)).hexdigest()
        prepared.append(PreparedWeight(name, array, dtype, digest, shape))
    return prepared


def _raw_bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array, without copying (0-d and bool arrays included)."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def plan_segments(weights: list[PreparedWeight]) -> tuple[list[SegmentEntry], int]:
    """Lay out segments in order, storing identical byte strings once; returns the table and region size."""
    entries = []
    placed: dict[tuple[str, int], int] = {}
    end = 0
    for w in weights:
        key = (w.sha256, w.array.nbytes)
        if key not in placed:
            placed[key] = align_up(end)
            end = placed[key] + w.array.nbytes
        entries.append(SegmentEntry(w.name, w.dtype, w.shape, placed[key], w.array.nbytes, w.sha256))
    return entries, align_up(end)


def seal(graph_section: bytes, data_length: int, major: int = FORMAT_MAJOR, minor: int = FORMAT_MINOR,
         flags: int = 0) -> bytes:
    """The header plus the graph section and its zero padding: everything before the data region.

    Public so that tests (and tools that rewrite a graph section) can produce correctly checksummed files.
    """
    if len(graph_section) > MAX_GRAPH_SECTION_BYTES:
        raise ProgramFormatError(f"graph section is {len(graph_section)} bytes, limit {MAX_GRAPH_SECTION_BYTES}")
    data_offset = align_up(HEADER_SIZE + len(graph_section))
    header = Header(major, minor, flags, HEADER_SIZE, data_offset + data_length, HEADER_SIZE,
                    len(graph_section), data_offset, data_length)
    digest = hashlib.sha256(header.pack() + graph_section).digest()
    raw = header.pack()
    raw = raw[:CHECKSUM_OFFSET] + digest + raw[CHECKSUM_OFFSET + CHECKSUM_SIZE:]
    return raw + graph_section + bytes(data_offset - HEADER_SIZE - len(graph_section))


def write_program(graph: Graph, metadata: Metadata, stream: BinaryIO, *,
                  methods: Mapping[str, Graph] | None = None, default_method: str = DEFAULT_METHOD,
                  state: Mapping[str, np.ndarray] | None = None) -> int:
    """Serialise to a binary stream; returns the number of bytes written.

    `methods` (name -> graph, `graph` being methods[default_method]) and `state` (name -> initial value)
    make a 1.2 document (program_parts.py); without them the document is the single-graph one.
    """
    methods = dict(methods) if methods else {default_method: graph}
    if methods.get(default_method) is not graph:
        raise ProgramFormatError(f"the program's graph is not its default method {default_method!r}")
    weights = prepare_method_weights(methods, state or {})
    entries, data_length = plan_segments(weights)
    parts = ProgramParts(methods, default_method, {s: state_segment_name(s) for s in state or {}},
                         {name: list(flat_constants(g)) for name, g in methods.items()})
    document = encode_document(graph, metadata, entries, parts)
    decode_document(document, data_length)  # the reader's checks: refuse to write what could not be read
    prefix = seal(canonical_json_bytes(document), data_length,
                  minor=FORMAT_MINOR if any(g.symbols or g.subgraphs for g in methods.values())
                  or not parts.is_plain() else STATIC_FORMAT_MINOR)
    stream.write(prefix)
    written = 0
    for w, e in zip(weights, entries):
        if e.offset < written or not e.nbytes:
            continue  # shared with an earlier identical segment, or empty
        _write_zeros(stream, e.offset - written)
        stream.write(_raw_bytes(w.array))
        written = e.offset + e.nbytes
    _write_zeros(stream, data_length - written)
    return len(prefix) + data_length


def prepare_method_weights(methods: Mapping[str, Graph], state: Mapping[str, np.ndarray]) -> list[PreparedWeight]:
    """Every method's constants once by name (methods share weights by name), then the state's initial
    values under their segment names. Two methods with different data under one name are refused."""
    weights: dict[str, PreparedWeight] = {}
    owner: dict[str, str] = {}
    source: dict[str, object] = {}  # name -> the array object prepared: shared objects are hashed once
    for method, graph in methods.items():
        # Bodies' constants under qualified names (ir/subgraphs.py), like any other of the method's.
        fresh = {n: a for n, a in flat_constants(graph).items() if source.get(n) is not a}
        source.update(fresh)
        for w in prepare_weights(Graph(specs=flat_constant_specs(graph), constants=fresh)):
            if w.name in weights and (w.sha256, w.dtype, w.shape) != (
                    weights[w.name].sha256, weights[w.name].dtype, weights[w.name].shape):
                raise ProgramFormatError(f"methods {owner[w.name]!r} and {method!r} both have a constant "
                                         f"{w.name!r}, with different values: rename one")
            weights.setdefault(w.name, w)
            owner.setdefault(w.name, method)
    if state:
        specs = {state_segment_name(s): TensorSpec(np.shape(a), DType.of(np.asarray(a))) for s, a in state.items()}
        for w in prepare_weights(Graph(specs=specs, constants={state_segment_name(s): np.asarray(a)
                                                                for s, a in state.items()})):
            if w.name in weights:
                raise ProgramFormatError(f"a constant is named {w.name!r}, the segment name of a state's initial "
                                         "value: rename it")
            weights[w.name] = w
    return list(weights.values())


def _write_zeros(stream: BinaryIO, n: int) -> None:
    while n > 0:
        chunk = min(n, len(_ZEROS))
        stream.write(_ZEROS[:chunk])
        n -= chunk


def save_program(graph: Graph, metadata: Metadata, path: str | os.PathLike[str], **parts: Any) -> None:
    """Write to a temporary file beside path, then rename over it.

    Readers that have the old file memory-mapped keep their (now unlinked) copy intact; overwriting in place
    would change their weights under them, or crash them with SIGBUS if the file got shorter.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write_program(graph, metadata, f, **parts)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a program file is not a secret
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def program_to_bytes(graph: Graph, metadata: Metadata, **parts: Any) -> bytes:
    """The file's bytes; `parts`: write_program's methods, default_method and state."""
    buffer = io.BytesIO()
    write_program(graph, metadata, buffer, **parts)
    return buffer.getvalue()

