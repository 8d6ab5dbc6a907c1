"""Program: a graph with its weights and metadata, as saved to and loaded from one program file."""

from __future__ import annotations

import hashlib
import mmap as mmap_module
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import ProgramFormatError
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import flat_constant_specs, flat_constants
from edgerun.program.canonical_json import canonical_json_bytes
from edgerun.program.format import HEADER_SIZE
from edgerun.program.graph_codec import encode_graph
from edgerun.program.reader import Buffer, DecodedProgram, decode_program
from edgerun.program.summary import ProgramSummary, summarize
from edgerun.program.writer import prepare_weights, program_to_bytes, save_program

_HASH_DOMAIN = b"edgerun program hash v1\0"


def default_metadata() -> dict[str, Any]:
    import edgerun  # at call time: edgerun/__init__ may itself import this module

    return {"producer": "edgerun", "edgerun_version": edgerun.__version__}


@dataclass(frozen=True)
class ProgramFileInfo:
    """Where a loaded program came from; absent on programs built in memory."""

    path: str | None
    format_version: tuple[int, int]
    file_bytes: int
    mmapped: bool
    weights_verified: bool


# eq=False: Graph holds numpy arrays, whose == is elementwise; compare programs with program_hash().
@dataclass(eq=False)
class Program:
    graph: Graph
    metadata: dict[str, Any] = field(default_factory=default_metadata)
    file_info: ProgramFileInfo | None = field(default=None, repr=False)
    # name -> (array, sha256) for arrays that cannot change under us (read-only), so hashing is cheap
    _digests: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict, repr=False)

    # -- writing -----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program file atomically (temporary file + rename)."""
        save_program(self.graph, self.metadata, path)

    def to_bytes(self) -> bytes:
        return program_to_bytes(self.graph, self.metadata)

    # -- reading -----------------------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *, verify_weights: bool = True) -> Program:
        """Load from memory. Weights are read-only views into `data` (copied first unless it is bytes)."""
        buffer = data if type(data) is bytes else bytes(data)
        return cls._from_decoded(decode_program(buffer, verify_weights), None, mmapped=False)

    @classmethod
    def read(cls, path: str | os.PathLike[str], *, mmap: bool = True, verify_weights: bool = True) -> Program:
        """Load a program file. With mmap=True the weights are read-only views of a map of the file.

        verify_weights=False skips hashing the weights (the header and graph are always verified), which
        makes loading a large mapped file cost only the graph section until the weights are touched.
        """
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_SIZE:  # also keeps mmap away from empty files, which it refuses
                raise ProgramFormatError(f"truncated program {os.fspath(path)!r}: {size} bytes, "
                                         f"the header alone is {HEADER_SIZE}")
            buffer: Buffer = mmap_module.mmap(f.fileno(), 0, access=mmap_module.ACCESS_READ) if mmap \
                else f.read()
        return cls._from_decoded(decode_program(buffer, verify_weights), os.fspath(path), mmapped=mmap)

    @classmethod
    def _from_decoded(cls, decoded: DecodedProgram, path: str | None, mmapped: bool) -> Program:
        h = decoded.header
        info = ProgramFileInfo(path, (h.major, h.minor), h.file_length, mmapped, decoded.weights_verified)
        program = cls(decoded.graph, decoded.metadata, info)
        arrays = flat_constants(decoded.graph)
        for e in decoded.segments:
            program._digests[e.name] = (arrays[e.name], e.sha256)
        return program

    # -- inspection --------------------------------------------------------------------------------------
    def weight_digests(self) -> dict[str, str]:
        """SHA-256 of each constant's little-endian bytes; taken from the file's table when loaded."""
        digests = {}
        to_hash = {}
        specs = flat_constant_specs(self.graph)  # bodies' constants under qualified names
        for name, array in flat_constants(self.graph).items():
            cached = self._digests.get(name)
            if cached is not None and cached[0] is array and not array.flags.writeable:
                digests[name] = cached[1]
            else:
                to_hash[name] = array
        if to_hash:
            partial = Graph(specs=specs, constants=to_hash)
            for w in prepare_weights(partial):
                digests[w.name] = w.sha256
                if not w.array.flags.writeable and w.array is to_hash[w.name]:
                    self._digests[w.name] = (w.array, w.sha256)
        return digests

    def program_hash(self) -> str:
        """A content hash (hex SHA-256) of the graph and the weights, for use as a cache key.

        It ignores metadata and file layout (format minor version, segment offsets, deduplication), so
        re-saving a program, or changing only its description, keeps the key.
        """
        digests = self.weight_digests()
        specs = flat_constant_specs(self.graph)
        weights = sorted([name, specs[name].dtype.value, list(specs[name].shape), digests[name]] for name in digests)
        content = canonical_json_bytes({"graph": encode_graph(self.graph), "weights": weights})
        return hashlib.sha256(_HASH_DOMAIN + content).hexdigest()

    def summary(self) -> ProgramSummary:
        return summarize(self.graph, self.metadata,
                         self.file_info.format_version if self.file_info else None,
                         self.file_info.file_bytes if self.file_info else None)
