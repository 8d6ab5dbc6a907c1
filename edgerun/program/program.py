"""Program: a graph with its weights and metadata, as saved to and loaded from one program file."""

from __future__ import annotations

import contextlib
import hashlib
import mmap as mmap_module
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError, ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.shared_constants import share_constants_by_name
from edgerun.ir.state import check_against_state
from edgerun.ir.subgraphs import flat_constant_specs, flat_constants
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import canonical_json_bytes
from edgerun.program.format import HEADER_SIZE
from edgerun.program.graph_codec import encode_graph
from edgerun.program.program_parts import DEFAULT_METHOD
from edgerun.program.reader import Buffer, DecodedProgram, decode_program
from edgerun.program.summary import ProgramSummary, summarize
from edgerun.program.writer import prepare_weights, program_to_bytes, save_program

_HASH_DOMAIN = b"edgerun program hash v1\0"
# How often pages are given back while a backend compiles (Program.weights_given_back): often enough that
# a reorder of a large model never has much of the file resident, rarely enough to cost nothing (a syscall).
PAGE_RETURN_INTERVAL_S = 0.01


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
    # Multi-method programs and state (program_parts.py, docs/program-format.md): every entry point by
    # name, `graph` being methods[default_method]; and each state's initial value by name.
    methods: dict[str, Graph] = field(default_factory=dict)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    default_method: str = DEFAULT_METHOD
    # Constants released to a backend after loading (release_constants): their arrays are placeholders.
    released: set[str] = field(default_factory=set, repr=False)
    # The memory map of the file the weights are views of (Program.read with mmap=True).
    _mapping: mmap_module.mmap | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.methods:
            self.methods = {self.default_method: self.graph}
        elif self.methods.get(self.default_method) is not self.graph:
            raise EdgerunError(f"Program: graph must be methods[{self.default_method!r}] (the default method)")

    @classmethod
    def from_methods(cls, methods: Mapping[str, Graph], *, default_method: str = DEFAULT_METHOD,
                     state: Mapping[str, np.ndarray] | None = None,
                     metadata: dict[str, Any] | None = None) -> Program:
        """A program with several entry points sharing weights (by constant name) and state.

        Constants that share a name but not their data are renamed apart in place (shared_constants.py)."""
        if default_method not in methods:
            raise EdgerunError(f"default method {default_method!r} is not among the methods {sorted(methods)}")
        share_constants_by_name(methods)
        program = cls(methods[default_method], metadata if metadata is not None else default_metadata(),
                      methods=dict(methods), state=dict(state or {}), default_method=default_method)
        program.check_state()
        return program

    def release_constants(self, names: set[str]) -> int:
        """Replace the constants `names` by read-only zeros of their shape and dtype, in one element's memory
        (the runtime does this for constants a backend keeps in its own form: runtime/constant_release.py);
        returns the bytes the arrays held. Such a program runs where it was loaded but can no longer be saved
        or hashed."""
        freed: dict[str, int] = {}  # methods share constants by name: count each once
        for graph in self._all_methods().values():
            for name in names & graph.constants.keys():
                array = graph.constants[name]
                if name not in self.released:
                    freed[name] = array.nbytes
                graph.constants[name] = np.broadcast_to(np.zeros((), array.dtype), array.shape)
        for name in names:
            self._digests.pop(name, None)
        self.released |= names
        return sum(freed.values())

    def _check_not_released(self, action: str) -> None:
        if self.released:
            raise EdgerunError(f"cannot {action} this program: its constants {sorted(self.released)[:3]} (and "
                               f"{max(len(self.released) - 3, 0)} more) were released to a backend after "
                               "loading; save or hash it before releasing them")

    def check_state(self) -> None:
        """Every method reads and writes only the program's states, with their specs (VerificationError)."""
        specs = {n: TensorSpec(np.shape(a), DType.of(np.asarray(a))) for n, a in self.state.items()}
        for name, graph in self._all_methods().items():
            check_against_state(graph, specs, name)

    def _all_methods(self) -> dict[str, Graph]:
        return {**self.methods, self.default_method: self.graph}  # `graph` may have been replaced

    # -- writing -----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program file atomically (temporary file + rename)."""
        self._check_not_released("save")
        save_program(self.graph, self.metadata, path, methods=self._all_methods(),
                     default_method=self.default_method, state=self.state)

    def to_bytes(self) -> bytes:
        self._check_not_released("serialise")
        return program_to_bytes(self.graph, self.metadata, methods=self._all_methods(),
                                default_method=self.default_method, state=self.state)

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
        program = cls._from_decoded(decode_program(buffer, verify_weights), os.fspath(path), mmapped=mmap)
        if isinstance(buffer, mmap_module.mmap):
            program._mapping = buffer
            program.drop_resident_weights()  # hashing the weights touched every page
        return program

    @classmethod
    def _from_decoded(cls, decoded: DecodedProgram, path: str | None, mmapped: bool) -> Program:
        h = decoded.header
        info = ProgramFileInfo(path, (h.major, h.minor), h.file_length, mmapped, decoded.weights_verified)
        program = cls(decoded.graph, decoded.metadata, info, methods=decoded.methods, state=decoded.state,
                      default_method=decoded.default_method)
        constants = {n: a for g in decoded.methods.values() for n, a in flat_constants(g).items()}
        for e in decoded.segments:
            if e.name in constants:  # the rest hold states' initial values
                program._digests[e.name] = (constants[e.name], e.sha256)
        return program

    def drop_resident_weights(self) -> None:
        """Give back the pages of the mapped file that this process has touched (madvise MADV_DONTNEED on
        the read-only map), so that weights a backend holds in its own form (prepacked, converted) are not
        resident twice. Nothing changes for readers: a page touched again is mapped again from the file
        (the page cache). A program not read from a mapped file has nothing to give back."""
        advice = getattr(mmap_module, "MADV_DONTNEED", None)
        if self._mapping is not None and not self._mapping.closed and advice is not None:
            self._mapping.madvise(advice)

    @contextlib.contextmanager
    def weights_given_back(self, every_s: float = PAGE_RETURN_INTERVAL_S) -> Iterator[None]:
        """While the block runs, a helper thread gives the mapped file's pages back every `every_s`
        (drop_resident_weights), and once more at the end. A backend that reads the weights to make copies
        of its own while it compiles (ONNX Runtime reordering Conv weights, with the GIL released) then
        never has the whole file resident beside its copies: ResNet-50's load peak on ORT alone went from
        419 MB to 330. Nothing runs for a program not read from a mapped file."""
        if self._mapping is None:
            yield
            return
        stop = threading.Event()

        def give_back() -> None:
            while not stop.wait(every_s):
                self.drop_resident_weights()

        helper = threading.Thread(target=give_back, name="edgerun-page-return", daemon=True)
        helper.start()
        try:
            yield
        finally:
            stop.set()
            helper.join()
            self.drop_resident_weights()

    # -- inspection --------------------------------------------------------------------------------------
    def weight_digests(self) -> dict[str, str]:
        """SHA-256 of each constant's little-endian bytes; taken from the file's table when loaded."""
        self._check_not_released("hash")
        digests = {}
        to_hash = {}
        constants = {n: a for g in self._all_methods().values() for n, a in flat_constants(g).items()}
        specs = {n: s for g in self._all_methods().values() for n, s in flat_constant_specs(g).items()}
        for name, array in constants.items():
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
        specs = {n: s for g in self._all_methods().values() for n, s in flat_constant_specs(g).items()}
        weights = sorted([name, specs[name].dtype.value, list(specs[name].shape), digests[name]]
                         for name in digests)
        document: dict[str, Any] = {"graph": encode_graph(self.graph), "weights": weights}
        if len(self._all_methods()) > 1 or self.state:  # plain programs keep the key they always had
            document["methods"] = {n: encode_graph(g) for n, g in self._all_methods().items()}
            document["default_method"] = self.default_method
            state_weights = prepare_weights(Graph(
                specs={n: TensorSpec(np.shape(a), DType.of(np.asarray(a))) for n, a in self.state.items()},
                constants=dict(self.state)))
            document["state"] = sorted([w.name, w.dtype.value, list(w.shape), w.sha256]
                                       for w in state_weights)
        content = canonical_json_bytes(document)
        return hashlib.sha256(_HASH_DOMAIN + content).hexdigest()

    def summary(self) -> ProgramSummary:
        state = {n: str(TensorSpec(np.shape(a), DType.of(np.asarray(a)))) for n, a in self.state.items()}
        return summarize(self.graph, self.metadata,
                         self.file_info.format_version if self.file_info else None,
                         self.file_info.file_bytes if self.file_info else None, self._all_methods(), state)
