"""Read a program file from a buffer (bytes or an mmap) with numpy and the standard library alone.

Order of checks: magic and version first (a newer major may lay out everything else differently), then
every header offset and length against the actual buffer size, then the checksum over header and graph
section, then the JSON, then the segment table against the data region, and last (optionally) the weights.
Nothing is allocated in proportion to a number read from the file before that number has been bounded.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import constant_home
from edgerun.program.canonical_json import parse_json_section
from edgerun.program.document import Metadata, decode_document
from edgerun.program.format import (
    CHECKSUM_OFFSET,
    CHECKSUM_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAX_GRAPH_SECTION_BYTES,
    MAX_HEADER_SIZE,
    Header,
    align_up,
)
from edgerun.program.segment_table import SegmentEntry, verify_data_region
from edgerun.program.string_segment import decode_strings

Buffer = bytes | mmap.mmap
KNOWN_FLAGS = 0  # no flags are defined in 1.x; a set bit would change meaning, so it is refused


@dataclass(frozen=True)
class DecodedProgram:
    graph: Graph  # constants are read-only views into the buffer
    metadata: Metadata
    header: Header
    segments: list[SegmentEntry]
    weights_verified: bool
    methods: dict[str, Graph]  # every method, the default's graph being `graph`
    default_method: str
    state: dict[str, np.ndarray]  # state name -> initial value (a read-only view, like the weights)


def check_header(header: Header, buffer_length: int) -> None:
    """Every header field against the reader's version and the buffer's real size."""
    ours = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
    theirs = f"{header.major}.{header.minor}"
    if header.major > FORMAT_MAJOR:
        raise ProgramFormatError(f"program format version {theirs} is newer than this reader's {ours}; "
                                 "upgrade edgerun to load it")
    if header.major < FORMAT_MAJOR:
        raise ProgramFormatError(f"program format version {theirs} is older than this reader's {ours} and no "
                                 "longer supported; re-export the model")
    if header.flags & ~KNOWN_FLAGS:
        raise ProgramFormatError(f"header flags 0x{header.flags:08x} set bits this reader does not know")
    newer_minor = header.minor > FORMAT_MINOR
    if not (HEADER_SIZE <= header.header_size <= MAX_HEADER_SIZE) or (
            header.header_size != HEADER_SIZE and not newer_minor):
        raise ProgramFormatError(f"header size {header.header_size} is invalid for version {theirs} "
                                 f"(expected {HEADER_SIZE})")
    if header.reserved != bytes(len(header.reserved)) and not newer_minor:
        raise ProgramFormatError("reserved header bytes are not zero")
    if header.file_length != buffer_length:
        if buffer_length < header.file_length:
            raise ProgramFormatError(f"truncated program: {buffer_length} bytes, the header says "
                                     f"{header.file_length}")
        raise ProgramFormatError(f"program has {buffer_length - header.file_length} bytes after its end "
                                 f"(the header says {header.file_length} bytes)")
    if header.graph_offset != header.header_size:
        raise ProgramFormatError(f"graph section offset {header.graph_offset} does not follow the "
                                 f"{header.header_size}-byte header")
    if header.graph_length > MAX_GRAPH_SECTION_BYTES:
        raise ProgramFormatError(f"graph section length {header.graph_length} exceeds the limit "
                                 f"{MAX_GRAPH_SECTION_BYTES}")
    graph_end = header.graph_offset + header.graph_length
    if header.data_offset != align_up(graph_end):
        raise ProgramFormatError(f"data region offset {header.data_offset} is not the first aligned offset "
                                 f"after the graph section (which ends at {graph_end})")
    if header.data_offset + header.data_length != header.file_length:
        raise ProgramFormatError(f"data region [{header.data_offset}, +{header.data_length}) does not end at "
                                 f"the end of the file ({header.file_length})")


def header_checksum(buffer: Buffer, header: Header) -> bytes:
    view = memoryview(buffer)  # slices of a view do not copy the (up to 64 MiB) graph section
    digest = hashlib.sha256()
    digest.update(view[:CHECKSUM_OFFSET])
    digest.update(bytes(CHECKSUM_SIZE))
    digest.update(view[CHECKSUM_OFFSET + CHECKSUM_SIZE:header.graph_offset + header.graph_length])
    return digest.digest()


# A mapped file's pages are given back after every this many bytes hashed.
DROP_EVERY_BYTES = 16 << 20


def _page_dropper(buffer: Buffer, base: int) -> Callable[[int], None] | None:
    """For a mapped file: a callback that gives back the pages hashed so far (madvise MADV_DONTNEED on the
    read-only map; a page touched again is mapped again from the file), so that verifying the weights does
    not make them all resident at once. None for bytes."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if not isinstance(buffer, mmap.mmap) or advice is None:
        return None
    done = [0]

    def hashed(end: int) -> None:
        end = (base + end) // mmap.PAGESIZE * mmap.PAGESIZE
        if end - done[0] >= DROP_EVERY_BYTES:
            buffer.madvise(advice, done[0], end - done[0])
            done[0] = end
    return hashed


def decode_program(buffer: Buffer, verify_weights: bool = True) -> DecodedProgram:
    header = Header.unpack(buffer[:HEADER_SIZE])
    check_header(header, len(buffer))
    if header_checksum(buffer, header) != header.checksum:
        raise ProgramFormatError("checksum mismatch in the header or graph section: the file is corrupted")
    graph_end = header.graph_offset + header.graph_length
    if any(buffer[graph_end:header.data_offset]):
        raise ProgramFormatError("padding after the graph section is not zero")

    document = parse_json_section(buffer[header.graph_offset:graph_end])
    graph, metadata, entries, parts = decode_document(document, header.data_length,
                                                      allow_unknown=header.minor > FORMAT_MINOR)
    region = memoryview(buffer)[header.data_offset:]
    if verify_weights:
        verify_data_region(region, entries, _page_dropper(buffer, header.data_offset))
    arrays = {}
    for e in entries:
        if e.dtype is DType.string:  # length-prefixed UTF-8, decoded into Python str (string_segment.py)
            array = decode_strings(region, e.offset, e.nbytes, e.shape, f"segment {e.name[:80]!r}")
        else:
            array = np.frombuffer(buffer, e.dtype.np.newbyteorder("<"), e.numel, header.data_offset + e.offset)
        array = array.reshape(e.shape)
        array.flags.writeable = False
        arrays[e.name] = array
    for method, method_graph in parts.methods.items():
        for name in parts.constant_names[method]:
            home = constant_home(method_graph, name)  # a body's constant has a qualified name (ir/subgraphs.py)
            assert home is not None
            home[0].constants[home[1]] = arrays[name]
    state = {name: arrays[segment] for name, segment in parts.state_segments.items()}
    return DecodedProgram(graph, metadata, header, entries, verify_weights, parts.methods, parts.default_method,
                          state)
