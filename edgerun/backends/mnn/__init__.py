"""The MNN backend: a partition becomes the ONNX the ONNX Runtime delegate emits, MNN's converter turns it into
an .mnn model, and MNN's runtime runs it. MNN is the engine inside the Walle seed; here it is a second fast
CPU engine the search can place partitions on. `pip install edgerun[mnn]`.

- **Converter as a function, in a child process.** `_tools.mnnconvert([...])` is the converter's C++ entry
  point. Never `MNN.tools` or the `mnnconvert` console script: their Python wrapper imports a logging
  module that runs `pip install` and sends usage data. The converter spills weights to a scratch file with
  a fixed name in the *current directory*, so two conversions sharing a working directory (two pytest
  workers, two processes of one service) read each other's weights: CI got all zeros from ViT this way.
  Conversions therefore run in a child process with each partition's own folder as its working directory
  (converter.py, convert_child.py); a converter that aborts takes only the child down.
- **Runtime.** MNN's Interpreter/session API: one session per partition (one thread unless
  `MnnBackend(threads=)` or $EDGERUN_MNN_THREADS says otherwise), inputs copied into its tensors and
  outputs copied back. bench/mnn_vs_ort.py measures it against `MNN.nn.load_module_from_file` on the same
  converted file: neither won consistently under load (docs/backends.md). Leave the session mode alone:
  Session_Backend_Auto (9) made MobileNetV2 14x slower.
- **Ops.** What the ONNX emitter translates, less what MNN's converter or kernels do not run exactly
  (`UNSUPPORTED`, found by the op-by-op tests in tests/backends/test_backends_mnn.py); float32 only for
  arithmetic (MNN computes integer tensors as int32 and has no int64 arithmetic).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput, is_composite
from edgerun.backends.conversion_cache import conversion_key, converted_file
from edgerun.backends.mnn.converter import ConverterProcess
from edgerun.backends.onnxruntime import build_model
from edgerun.backends.onnxruntime.onnx_ops import COMPOSITES as ONNX_COMPOSITES
from edgerun.backends.onnxruntime.onnx_ops import SUPPORTED as ONNX_SUPPORTED
from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.ir.decompose import decomposed
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import pool_geometry
from edgerun.ir.region import Region, regions_of


class _quiet_stdout:
    """MNN prints on fd 1 (the converter's progress, the CPU features at import, the precision of every
    session); keep it off the caller's output."""

    def __enter__(self) -> None:
        self.saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self.saved, 1)
        os.close(self.saved)


try:
    # MNN itself (4 MB resident) is imported when a partition first compiles (`_mnn`): a load whose placement
    # puts nothing on MNN, a cached `auto` one above all, does not pay for it.
    if importlib.util.find_spec("MNN") is None:
        raise ImportError("MNN is missing")
    # MNN's converter entry point (the C++ module, not MNN.tools), imported only by the conversion child.
    _converter = importlib.util.find_spec("_tools")
    if _converter is None or _converter.origin is None:
        raise ImportError("MNN's converter module _tools is missing")
    CONVERTER = ConverterProcess(os.path.dirname(os.path.abspath(_converter.origin)))
except ImportError as exc:  # the registry turns this into BackendUnavailableError naming the extra
    raise ModuleNotFoundError("MNN is not installed: pip install edgerun[mnn]", name="MNN") from exc

# MNN's worker threads wait busily for work: on the 2 shared cores of the dev box, under load, a GEMM
# 128x256x512 ran in 1.6 ms on one thread and 7.8 ms on two (ORT's non-spinning pool gains from two).
DEFAULT_THREADS = 1
TUNED_THREADS = 2  # the alternative calibration times (bench/peers.py runs MNN on 2 threads)
# Below this much work (flops plus bytes moved, summed over a partition's nodes) a partition runs on one
# thread whatever calibration chose (`MnnBackend.partition_threads`): the calibration's GEMM, conv and exp
# (35, 15 and 4.2 million) are above it; its tiny MLP (1.6 million), the zoo's MLP (1.7) and DIN (1.2) below.
SMALL_PARTITION_WORK = 3e6
F32 = frozenset({DType.float32})
# Ops whose ONNX form MNN does not run as the reference does.
# Found by the op-by-op tests: MNN's Round rounds halves away from zero (the IR: to even), its Mod is not
# C fmod on negative operands, its MaxPool ignores dilation, and its ScatterND does not apply
# reduction="add" (scatter_add's rows come out overwritten, not summed: 2.5 off on the ORT op cases).
UNSUPPORTED = frozenset({"round", "mod", "scatter_add"})
# Ops whose results are int64 in the IR: MNN holds integers as int32 and has no int64 arithmetic.
INT64_OPS = frozenset({"argmax", "argmin", "logical_xor"})
# Data movement and comparisons run on every dtype MNN holds; arithmetic on float32 only. int64 values
# become int32 inside MNN: see `_int64_fits`.
LAYOUT_DTYPES = frozenset({DType.float32, DType.int32, DType.bool})
LAYOUT_OPS = frozenset({"raster", "where", "eq", "lt", "le", "gt", "ge", "ne", "logical_and", "logical_or",
                        "logical_not", "cast", "gather"})
WITH_INT64 = LAYOUT_DTYPES | {DType.int64}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# Composites MNN runs whole as the ONNX Runtime delegate emits them, found by the composite cases of the ORT
# op tests: MNN's Gelu is the tanh approximation in both modes (1.5e-4 off), it does not convert ONNX
# Runtime's SimplifiedLayerNormalization (rms_norm), and its nearest Resize rounds differently. Those run
# decomposed on MNN (`MnnBackend.supports`).
WHOLE_COMPOSITES = frozenset({"relu", "clamp", "softmax", "layer_norm", "conv_transpose2d"})


def _support_table() -> dict[str, OpSupport]:
    table: dict[str, OpSupport] = {}
    for op, rule in ONNX_SUPPORTED.items():
        if op in UNSUPPORTED or op in INT64_OPS:
            continue
        if op in LAYOUT_OPS:
            table[op] = OpSupport(dtypes=WITH_INT64, check=_all_of(rule.check, _int64_fits))
        else:
            table[op] = OpSupport(dtypes=F32, check=_undilated if op == "max_pool2d" else rule.check)
    table["raster"] = OpSupport(dtypes=WITH_INT64, check=_all_of(_raster_ok, _int64_fits))
    table["where"] = OpSupport(dtypes=WITH_INT64, check=_all_of(table["where"].check, _where_ok))
    table["gather"] = OpSupport(dtypes=WITH_INT64, check=_all_of(table["gather"].check, _gather_ok))
    return table


Check = Callable[[Node, Graph], bool]


def _all_of(*checks: Check | None) -> Check:
    return lambda node, graph: all(c(node, graph) for c in checks if c is not None)


def _int64_fits(node: Node, graph: Graph) -> bool:
    """MNN holds int64 as int32, so an int64 value it reads must fit: a constant that does, or a graph input
    that some gather of the graph uses as indices. Such an input is bounded by that table (whichever backend
    runs the gather raises on an index outside it, and the MNN runner checks the ones it runs), so a call
    that returns has fitted it. Computed int64 values (and int64 tables) stay elsewhere."""
    for value in node.inputs:
        if not value or graph.specs[value].dtype is not DType.int64:
            continue
        if value in graph.constants:
            data = graph.constants[value]
            if data.size and (int(data.min()) < INT32_MIN or int(data.max()) > INT32_MAX):
                return False
        elif value not in graph.inputs or not any(n.op == "gather" and n.inputs[1] == value for n in graph.nodes):
            return False
    return not (node.op == "gather" and graph.specs[node.inputs[0]].dtype is DType.int64)


def _where_ok(node: Node, graph: Graph) -> bool:
    """MNN's Where reads a partly broadcast operand (a row against a matrix) past its end: each operand
    must have the output's shape or one element."""
    shape = graph.specs[node.outputs[0]].shape
    return all(graph.specs[v].shape == shape or graph.specs[v].numel == 1 for v in node.inputs)


def _gather_ok(node: Node, graph: Graph) -> bool:
    """MNN reads a row for an index outside the table where the reference raises: the indices must be
    constants inside it, or values the runner checks before each run (partition inputs; so not computed
    inside the graph)."""
    indices = node.inputs[1]
    rows = gather_rows(node, graph)
    if rows > INT32_MAX:
        return False
    if indices in graph.constants:
        idx = graph.constants[indices]
        return not idx.size or (int(idx.min()) >= -rows and int(idx.max()) < rows)
    return indices in graph.inputs


def gather_rows(node: Node, graph: Graph) -> int:
    """The size of the gathered axis: indices must lie in [-rows, rows)."""
    shape = graph.specs[node.inputs[0]].shape
    return int(shape[int(node.attrs.get("axis", 0)) % max(len(shape), 1)]) if shape else 1


def _raster_ok(node: Node, graph: Graph) -> bool:
    """One region, read forwards: a reshape, transpose, slice, broadcast, constant pad or channel shuffle.
    MNN 3.6.1 merges the layout ops it converts into rasters of its own, and on chains of the pieces a
    multi-region raster emits (Concat of Slices, Expands and reversing Slices) it returned wrong values or
    aborted the process, and it padded with 0 where the fill was -1 (a fuzz of pad/transpose/slice/concat
    chains, docs/backends.md). Concats, reflect and edge pads, flips and non-zero fills stay elsewhere."""
    regions = regions_of(node.attrs)
    fill = node.attrs.get("fill")
    if len(regions) == 1:
        return all(s >= 0 for s in regions[0].src_strides) and (fill is None or fill == 0)
    return _is_concat_of_whole_inputs(node, graph, regions)


# Past this many output elements a many-region raster is not examined for MNN (the coverage test is per element).
CONCAT_CHECK_LIMIT = 1 << 16


def _is_concat_of_whole_inputs(node: Node, graph: Graph, regions: Sequence[Region]) -> bool:
    """Every region copies one whole input, in order, each element once or broadcast along some axes
    (Concat of inputs or of Expands of them, as DIN's feature rows are), and together they write every output
    element once. Slices among the pieces are what MNN 3.6.1 got wrong; these have none."""
    out_numel = int(graph.specs[node.outputs[0]].numel)
    if out_numel > CONCAT_CHECK_LIMIT or sum(r.numel for r in regions) != out_numel:
        return False
    for r in regions:
        if r.src_offset or not _reads_whole_source(r, int(graph.specs[node.inputs[r.src]].numel)):
            return False
    written = np.zeros(out_numel, np.int64)
    for r in regions:
        np.add.at(written, r.index_grids()[0], 1)
    return bool((written == 1).all())


def _reads_whole_source(region: Region, numel: int) -> bool:
    """The region's non-zero source strides walk all `numel` source elements in row-major order."""
    expected = 1
    for n, s in reversed(list(zip(region.size, region.src_strides))):
        if n == 1 or s == 0:
            continue
        if s != expected:
            return False
        expected *= n
    return expected == numel


def _undilated(node: Node, graph: Graph) -> bool:
    return tuple(pool_geometry(node.attrs)[3]) == (1, 1)


class MnnBackend(Backend):
    name = "mnn"
    extra = "mnn"
    library = "MNN"
    supported = _support_table()
    # Until calibration measures this machine, figures of the same order as ONNX Runtime's MLAS on 2 cores.
    throughput = Throughput(flops_per_s=2e10, bytes_per_s=4e9, dispatch_s=1e-6)
    copies_at_boundary = True  # each call copies into and out of MNN's own tensors
    fuses_activations = True  # the converter folds Relu and Relu6 (Clip 0..6) into the Conv before them
    composites = {op: rule for op, rule in ONNX_COMPOSITES.items() if op in WHOLE_COMPOSITES}

    def __init__(self, threads: int | None = None) -> None:
        env = os.environ.get("EDGERUN_MNN_THREADS")
        # What the user fixed (None: calibration may choose); `threads` is what compile uses.
        self.threads_setting: int | None = threads or (int(env) if env else None)
        self.threads = self.threads_setting or DEFAULT_THREADS

    def supports(self, node: Node, graph: Graph) -> bool:
        """A composite MNN does not keep whole is still MNN's when it runs every piece of its decomposition
        (the runtime lowers it there after placement, and the base class's cost counts the pieces): GELU,
        for one, so that a model is not cut around it (MLP on MNN would otherwise be three partitions)."""
        if is_composite(node.op) and not self.keeps_whole(node, graph):
            return self._runs_pieces(node, graph)
        return super().supports(node, graph)

    def _runs_pieces(self, node: Node, graph: Graph) -> bool:
        alone = Graph()
        for value in dict.fromkeys(v for v in node.inputs if v):
            if value in graph.constants:
                alone.add_constant(graph.constants[value], name=value)
            else:
                alone.add_input(value, graph.specs[value])
        alone.nodes.append(node)
        alone.specs.update({v: graph.specs[v] for v in node.outputs})
        alone.outputs = list(node.outputs)
        pieces = decomposed(alone)
        return all(self.supports(piece, pieces) for piece in pieces.nodes)

    def settings(self) -> dict[str, object]:
        return {"threads_setting": self.threads_setting}

    def tunable_settings(self) -> dict[str, tuple[object, ...]]:
        # One thread or two, when neither the constructor nor $EDGERUN_MNN_THREADS fixed it: MNN's pool waits
        # busily, which wins on an idle machine and loses on a shared one (calibration measures both).
        return {"threads": (DEFAULT_THREADS, TUNED_THREADS)} if self.threads_setting is None else {}

    def apply_settings(self, chosen: Mapping[str, object]) -> None:
        unknown = set(chosen) - set(self.tunable_settings())
        if unknown:
            raise ValueError(f"mnn cannot tune {sorted(unknown)} here")
        if "threads" in chosen:
            self.threads = int(chosen["threads"])  # type: ignore[call-overload]

    def compile(self, subgraph: Graph) -> CompiledPartition:
        for node in subgraph.nodes:
            if node.op not in self.supported and node.op not in self.composites:
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="not supported by the mnn backend")
        model, external = build_model(subgraph)
        # Converted once per content on this machine (conversion_cache): the key covers the emitted model,
        # its weights, MNN's version and the converter's flags.
        key = conversion_key(model, external, "mnn", _mnn().version(), *CONVERT_FLAGS)
        threads = self.partition_threads(subgraph)
        with converted_file("mnn", key, lambda target: convert_model(model, external, target), ".mnn") as path:
            runner = SessionRunner(path, subgraph, threads)
        return CompiledPartition(self.name, subgraph, runner.run, release=runner.close,
                                 info={"threads": threads, "mnn_bytes": runner.model_bytes})

    def partition_threads(self, subgraph: Graph) -> int:
        """The thread count for one partition: a small one runs on one thread unless the user fixed the
        count. MNN's pool waits busily and wakes per op: DIN (0.25 MFLOP, 37 ops) took 17 us on one thread
        and 33-39 on two on an idle machine (the peers benchmark's MNN), 52 against 206 us at load 8; the MLP
        (0.54 MFLOP) 52 against 145."""
        if self.threads_setting is not None or self.threads == 1:
            return self.threads
        work = sum(c.flops + c.bytes_moved for c in (self.cost(n, subgraph) for n in subgraph.nodes))
        return self.threads if work >= SMALL_PARTITION_WORK else 1


@functools.cache
def _mnn() -> Any:
    """The MNN module, imported on first use (it prints its CPU features on import)."""
    with _quiet_stdout():
        import MNN
    return MNN


def create_backend(threads: int | None = None) -> MnnBackend:
    return MnnBackend(threads)


def onnx_with_weights(subgraph: Graph) -> Any:
    """The partition's ONNX model with every weight inside it (MNN's converter reads no OrtValues)."""
    return _with_weights(*build_model(subgraph))


def _with_weights(model: Any, external: Mapping[str, np.ndarray]) -> Any:
    from onnx import numpy_helper

    for tensor in model.graph.initializer:
        value = external.get(tensor.name)
        if value is not None:
            tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    return model


CONVERT_FLAGS = ("--bizCode", "edgerun", "--keepInputFormat")


def convert(subgraph: Graph, folder: Path) -> Path:
    """The partition converted to `folder/partition.mnn` (no cache; the benches time conversion with it)."""
    target = folder / "partition.mnn"
    convert_model(*build_model(subgraph), target)
    return target


def convert_model(model: Any, external: Mapping[str, np.ndarray], target: Path) -> None:
    """ONNX -> `target` (.mnn) through the converter's C++ entry point, run by the converter process with
    `target`'s folder as its working directory (the folder must be this conversion's own); EdgerunError with
    the converter's log when it fails."""
    folder = target.parent
    source = folder / "partition.onnx"
    source.write_bytes(_with_weights(model, external).SerializeToString())
    CONVERTER.convert(folder, ["mnnconvert", "-f", "ONNX", "--modelFile", str(source), "--MNNModel", str(target),
                               *CONVERT_FLAGS])
    if not target.exists() or target.stat().st_size == 0:
        log = (folder / "convert.log").read_text(errors="replace").strip().splitlines()[-8:]
        raise EdgerunError("MNN's converter produced no model for a partition: " + " | ".join(log))
    source.unlink()


_MNN_DTYPE = {DType.float32: np.float32, DType.int32: np.int32, DType.bool: np.int32, DType.int64: np.int32}


class SessionRunner:
    """One MNN Interpreter session. Each input and output has a host tensor of its own, made once, with a
    numpy view of its memory: a call checks the gather indices among its inputs, writes each input into its
    host view (int64 and bool become MNN's int32 there) and copies it into the session, runs, and copies
    each output back through its host tensor. No MNN.Tensor is made per call. (The session's own tensors
    are not written through views: MNN may keep an input in another layout, NC4HW4, and read that.)"""

    def __init__(self, path: Path, graph: Graph, threads: int) -> None:
        self.model_bytes = path.stat().st_size
        self.interpreter = _mnn().Interpreter(str(path))
        with _quiet_stdout():
            self.session = self.interpreter.createSession({"numThread": threads, "precision": "high"})
        self.graph = graph
        self.inputs = [self.interpreter.getSessionInput(self.session, name) for name in graph.inputs]
        self.outputs = [self.interpreter.getSessionOutput(self.session, name) for name in graph.outputs]
        self._in_host = [self._host(name) for name in graph.inputs]
        self._out_host = [self._host(name) for name in graph.outputs]
        self._feeds = [(tensor, host, view) for tensor, (host, view) in zip(self.inputs, self._in_host)]
        self._fetches = [(tensor, host, view) for tensor, (host, view) in zip(self.outputs, self._out_host)]
        self._bounds = IndexBounds(graph)

    def _host(self, name: str) -> tuple[Any, np.ndarray]:
        spec = self.graph.specs[name]
        if spec.dtype not in _MNN_DTYPE:
            raise EdgerunError(f"MNN holds no {spec.dtype.value} tensors ({name})")
        shape = list(spec.shape) or [1]
        mnn = _mnn()
        host = mnn.Tensor(shape, _halide(spec.dtype), np.zeros(shape, _MNN_DTYPE[spec.dtype]),
                          mnn.Tensor_DimensionType_Caffe)
        return host, np.asarray(host.getNumpyData()).reshape(spec.shape)

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        if self._bounds.checks:
            self._bounds.check(inputs)
        for (tensor, host, view), array in zip(self._feeds, inputs):
            np.copyto(view, array, casting="unsafe")
            tensor.copyFrom(host)
        if self.interpreter is None:
            raise EdgerunError("this MNN partition was released (LoadedProgram.release)")
        code = self.interpreter.runSession(self.session)
        if code != 0:  # MNN leaves the outputs as they were: never hand those back as a result
            raise EdgerunError(f"MNN's runSession failed with error code {code} ({_MNN_ERRORS.get(code, 'unknown')})")
        for (tensor, host, view), array in zip(self._fetches, outputs):
            tensor.copyToHostTensor(host)
            np.copyto(array, view, casting="unsafe")


    def close(self) -> None:
        """Free the session and the interpreter's model now (CompiledPartition.release); a run after this
        raises."""
        self.interpreter = self.session = None
        self.inputs, self.outputs, self._feeds, self._fetches = [], [], [], []


class IndexBounds:
    """The bounds of the partition inputs that MNN gathers with: an index outside its table raises, as on
    the reference, instead of reading whatever row MNN finds there (or wrapping as int32). The checked
    inputs are flattened into one int64 buffer and tested with one comparison per bound."""

    def __init__(self, graph: Graph) -> None:
        limits: dict[int, int] = {}
        for node in graph.nodes:
            if node.op == "gather" and node.inputs[1] in graph.inputs:
                k = graph.inputs.index(node.inputs[1])
                limits[k] = min(limits.get(k, INT32_MAX), gather_rows(node, graph))
        self.checks = sorted(limits)
        self.names = [graph.inputs[k] for k in self.checks]
        sizes = [int(graph.specs[graph.inputs[k]].numel) for k in self.checks]
        self.starts = np.cumsum([0, *sizes])
        self.buffer = np.empty(int(self.starts[-1]), np.int64)
        rows = np.repeat([limits[k] for k in self.checks], sizes).astype(np.int64)
        self.low = -rows  # index + rows must lie in [0, 2 * rows)
        self.span = (2 * rows).astype(np.uint64)
        self.shifted = np.empty_like(self.buffer)
        self.inside = np.empty(self.buffer.shape, bool)

    def check(self, inputs: Sequence[np.ndarray]) -> None:
        np.concatenate([inputs[k] for k in self.checks], axis=None, out=self.buffer, casting="same_kind")
        np.subtract(self.buffer, self.low, out=self.shifted)
        np.less(self.shifted.view(np.uint64), self.span, out=self.inside)
        if np.count_nonzero(self.inside) != self.inside.size:  # 1 us less than .all() on DIN's 42
            bad = int(np.argmin(self.inside))
            which = int(np.searchsorted(self.starts, bad, side="right")) - 1
            raise EdgerunError(f"gather index {int(self.buffer[bad])} in input {self.names[which]!r} is outside "
                               f"[{int(self.low[bad])}, {-int(self.low[bad])}) (the table it indexes)")


# MNN::ErrorCode (include/MNN/ErrorCode.hpp).
_MNN_ERRORS = {1: "out of memory", 2: "not supported", 3: "compute size error", 4: "no execution",
               5: "invalid value", 10: "input data error", 11: "call back stop", 20: "tensor not supported",
               21: "tensor need divide"}


def _halide(dtype: DType) -> Any:
    return _mnn().Halide_Type_Float if dtype is DType.float32 else _mnn().Halide_Type_Int
