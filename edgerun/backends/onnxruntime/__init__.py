"""The ONNX Runtime delegate: a partition becomes an in-memory ONNX model run by one InferenceSession.

This is the fast CPU path (XNNPACK's role in ExecuTorch). Weights are handed to ORT as OrtValues over the
program's own (memory-mapped) arrays instead of being serialised into the model, and each run binds the
runtime's arena views as ORT's input and output buffers (IO binding), so a call copies nothing on the way in
or out. Ops ORT cannot run exactly are not claimed (onnx_ops.SUPPORTED); a partition that fails to build
is the runtime's to put back on the reference backend, with a warning.

Threads: `intra_op_num_threads` from the constructor, else $EDGERUN_ORT_THREADS, else 2. Partitions too
small to gain from a thread pool get one thread (`pooled`: too little work in all, or, for a pool that
sleeps, too little per op). Whether pool threads spin waiting for work is
`spin=True/False`, else $EDGERUN_ORT_SPIN=1/0, else calibration's choice (edgerun.search.calibrate times
the threaded benchmarks both ways and sets `spin`), else off: spinning pools, or other processes on a
shared machine, steal each other's cores (on the dev box under load: MobileNetV2 all on ORT 90 ms
spinning, 10 ms not), while on an idle machine spinning wins by 1.2-1.8x on some models (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx  # noqa: F401  # every partition is built as an ONNX model: without onnx the backend is unavailable
import onnxruntime as ort  # the optional extra: the registry turns its absence into BackendUnavailableError

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput, node_work
from edgerun.backends.onnxruntime.onnx_control_flow import CONTROL_FLOW, emit_node
from edgerun.backends.onnxruntime.onnx_in_place import may_overwrite
from edgerun.backends.onnxruntime.onnx_llm_ops import LLM_COMPOSITES, lower_unfused_attention
from edgerun.backends.onnxruntime.onnx_ops import (
    COMPOSITES,
    EXTERNAL_CONSTANT_BYTES,
    ONNX_DTYPE,
    OPSET,
    SUPPORTED,
    OnnxBuilder,
    reads,
)
from edgerun.backends.onnxruntime.onnx_prepacked import (
    hand_over,
    read_in_place,
    release_initializer,
    released_initializers,
    shared_initializers,
)
from edgerun.backends.onnxruntime.onnx_quant_ops import MS_DOMAIN, QUANT_SUPPORTED
from edgerun.backends.onnxruntime.onnx_shape_variants import ShapeVariants, describe, generic_model
from edgerun.backends.onnxruntime.onnx_tidy import drop_noop_reshapes, fold_expand_reshapes
from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.heap import return_freed_memory
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph

DEFAULT_THREADS = 2
# Below this many elementary operations a partition runs single-threaded, unless the pool spins (a
# sleeping pool's wake-up costs more than the work).
SMALL_PARTITION_FLOPS = 2e6
# A sleeping pool also needs its partition's ops to average this much work: many tiny kernels around a few
# GEMMs pay more in wake-ups than the GEMMs gain (DIN's train step, 308 ops averaging 81K: 1.50 CPU ms a
# step on one thread against 1.68 on two, wall p20 1.21 against 1.57, interleaved at load 9; the MLP's and
# the digits CNN's steps average 350K and 450K, ResNet-50 67M, MiniLM 3.6M).
POOL_NODE_FLOPS = 1e5
# With a spinning pool, a small partition still uses it when its ops average at least this much work.
SPIN_POOL_NODE_FLOPS = 2e4


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    extra = "onnxruntime"
    library = "onnxruntime"
    supported = {**SUPPORTED, **QUANT_SUPPORTED, "raster": OpSupport(dtypes=frozenset(ONNX_DTYPE))}
    # Relu, Clip, Gelu, Softmax, LayerNormalization (onnx_ops); RMSNorm, GroupQueryAttention (onnx_llm_ops):
    # one ORT kernel each.
    composites = {**COMPOSITES, **LLM_COMPOSITES}
    control_flow = CONTROL_FLOW  # If, Loop, Scan, bodies emitted like any partition (onnx_control_flow.py)
    # Until calibration measures this machine (edgerun.search), figures typical of ORT's MLAS on 2 cores.
    # Integer: MLAS's u8s8 kernels (QLinearConv, MatMulInteger) pair products in 16 bits, about twice the float rate.
    throughput = Throughput(flops_per_s=5e10, bytes_per_s=8e9, dispatch_s=1e-6, integer_flops_per_s=1e11)
    partition_overhead_s = 1.5e-5  # one run_with_iobinding call, measured on the dev machine
    fuses_activations = True  # Conv/MatMul + Relu/Clip/Add fusions: the search keeps those pairs together

    def __init__(self, threads: int | None = None, spin: bool | None = None) -> None:
        self.threads = threads or int(os.environ.get("EDGERUN_ORT_THREADS", DEFAULT_THREADS))
        env_spin = os.environ.get("EDGERUN_ORT_SPIN")
        # What the user fixed (None: calibration decides); `spin` is what compile uses.
        self.spin_setting: bool | None = spin if spin is not None else (None if env_spin is None
                                                                         else env_spin == "1")
        self.spin = bool(self.spin_setting)
        self._shape_variants = ShapeVariants()

    def settings(self) -> dict[str, object]:
        return {"threads": self.threads, "spin_setting": self.spin_setting}

    def tunable_settings(self) -> dict[str, tuple[object, ...]]:
        # Pool-thread spinning, when neither the constructor nor $EDGERUN_ORT_SPIN fixed it.
        return {"spin": (self.spin, not self.spin)} if self.spin_setting is None else {}

    def apply_settings(self, chosen: Mapping[str, object]) -> None:
        unknown = set(chosen) - set(self.tunable_settings())
        if unknown:
            raise ValueError(f"onnxruntime cannot tune {sorted(unknown)} here")
        if "spin" in chosen:
            self.spin = bool(chosen["spin"])

    def compile(self, subgraph: Graph) -> CompiledPartition:
        for node in subgraph.nodes:
            if node.op not in self.supported and node.op not in self.composites and node.op not in self.control_flow:
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="not supported by the onnxruntime backend")
        emitted = emit_partition(subgraph)
        model, external, overwrites = emitted.model, emitted.external, emitted.overwrites
        in_place = read_in_place(model, external)  # bound to the program's arrays at run time, not prepacked
        for name in in_place:
            del external[name]
        threads = self.threads if pooled(sum(node_work(n, subgraph)[0] for n in subgraph.nodes),
                                         len(subgraph.nodes), self.spin) else 1
        # Outputs that may also be written over an input (a weight's update over the weight: onnx_in_place.py);
        # unlike `overwrites`, the runner stages nothing for them when the runtime hands two buffers.
        in_place_outputs = may_overwrite(model.graph, set(subgraph.inputs) - set(overwrites.values()))
        runner, shared_by = self._session_for(model, subgraph, external, in_place, overwrites,
                                              (threads, self.spin))
        session = runner.session
        assert session is not None  # just built or joined: only a later compile replaces it
        released = released_initializers(runner.model, shared_initializers(session), _probe_session)
        released_constants = _program_constants(released, runner, subgraph)
        for name in released:  # ORT holds its packed copy: keep no reference to the program's array here
            runner.external.pop(name, None)
            release_initializer(session, name)
        return CompiledPartition(self.name, subgraph, runner.run, released_constants=released_constants,
                                 overwrites_inputs={**in_place_outputs, **overwrites}, release=runner.close,
                                 info={"onnx_nodes": len(model.graph.node), "threads": threads,
                                       "fused_attentions": emitted.fused_attentions,
                                       "constants_read_in_place": len(in_place),
                                       "session_shared_by": shared_by,
                                       "gathered_rasters": sum(1 for n in model.graph.node
                                                               if n.op_type == "Gather"
                                                               and "raster_index" in n.input[1])})

    def _session_for(self, model: Any, subgraph: Graph, external: dict[str, np.ndarray],
                     in_place: dict[str, np.ndarray], overwrites: dict[str, str],
                     settings: tuple[Any, ...]) -> tuple[BoundSession, int]:
        """The runner of `model`, and how many partitions its session serves. A partition that is an earlier
        one's graph at other sizes (an LLM's decode step and its prefill chunk) joins that one's session,
        remade generic over both (onnx_shape_variants.py): one prepacked copy of the weights, not one each."""
        threads, spin = settings
        # Spinning is not part of the form: the search tunes it per method (an LLM's decode spins, its prefill
        # not), and two sessions would prepack two copies of the weights. A shared session spins if any does.
        variant, arrays = describe(model, {**external, **in_place}, (threads,), spin=spin)
        group = self._shape_variants.find(variant, arrays) if arrays else None
        if group is not None:
            same = next((v for v in group if v.dims == variant.dims and v.spin == spin), None)
            if same is not None:  # this very graph again: its session as it is (a spin trial gets its own)
                runner = BoundSession.adopting(same.member(), subgraph, overwrites)
                variant.member = weakref.ref(runner)
                group.append(variant)
                return runner, len(group)
            generic = generic_model(model, [*group, variant])
            if generic is not None:
                members = [v.member() for v in group]
                for member in members:  # freed first: the generic session prepacks into the memory they held
                    member.release()
                return_freed_memory()  # else fragments of it stay resident beside the new session (21 MB)
                try:
                    session = make_session(generic, external, threads, any(v.spin for v in [*group, variant]))
                except Exception:
                    for member, v in zip(members, group):  # each back on a session of its own graph
                        member.rebuild({name: a for name, a in zip(v.array_names, arrays)}, settings)
                    raise
                runner = BoundSession(session, subgraph, external, in_place, overwrites, model=generic)
                for member in members:
                    member.adopt(runner)
                variant.member = weakref.ref(runner)
                group.append(variant)
                return runner, len(group)
        runner = BoundSession(make_session(model, external, threads, spin), subgraph, external,
                              in_place, overwrites, model=model)
        variant.member = weakref.ref(runner)
        if arrays:
            self._shape_variants.add(variant)
        return runner, 1


def pooled(work: float, nodes: int, spin: bool) -> bool:
    """Whether a partition of `nodes` ops doing `work` elementary operations in all gets the thread pool."""
    per_node = work / max(nodes, 1)
    if spin:
        # A spinning pool has no wake-up to pay, so a small partition of a few sizeable ops gains from it (the
        # MLP, 30K flops a node: 14 us on 2 spinning threads, 21 on one); one of many tiny ops does not (DIN,
        # 7K a node: 40 us against 28).
        return work >= SMALL_PARTITION_FLOPS or per_node >= SPIN_POOL_NODE_FLOPS
    return work >= SMALL_PARTITION_FLOPS and per_node >= POOL_NODE_FLOPS


def _program_constants(released: set[str], runner: BoundSession, graph: Graph) -> frozenset[str]:
    """The constants of `graph` that the session no longer reads: every array the session reads in place
    that overlaps one (the constant itself, or a view the emitter made of it: MatMulNBits' flattened scales)
    was released. A shared session's model may name arrays of other graphs; those are not this one's."""
    def span(a: np.ndarray) -> tuple[int, int]:
        return int(a.ctypes.data), int(a.ctypes.data) + a.nbytes

    spans = {name: span(a) for name, a in {**runner.external, **runner.in_place}.items() if a.nbytes}
    gone = [spans[name] for name in released if name in spans]
    names = set()
    for name, constant in graph.constants.items():
        if not constant.nbytes:
            continue
        lo, hi = span(constant)
        if any(a < hi and lo < b for a, b in gone) and all(
                n in released for n, (a, b) in spans.items() if a < hi and lo < b):
            names.add(name)
    return frozenset(names)


def create_backend(threads: int | None = None, spin: bool | None = None) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(threads, spin)


@dataclass
class EmittedPartition:
    """A partition as ONNX, with what the emitters found that compile declares or reports."""

    model: Any  # onnx.ModelProto
    external: dict[str, np.ndarray]  # constants passed as external OrtValues (name -> array)
    overwrites: dict[str, str]  # output -> the input whose buffer a kernel updates in place (overwrites_inputs)
    fused_attentions: int  # cache_attention nodes emitted as GroupQueryAttention


def build_model(subgraph: Graph) -> tuple[Any, dict[str, np.ndarray]]:
    """An ONNX ModelProto for `subgraph`, and the constants to pass as external OrtValues (name -> array)."""
    emitted = emit_partition(subgraph)
    return emitted.model, emitted.external


def emit_partition(subgraph: Graph) -> EmittedPartition:
    """`subgraph` as ONNX (build_model), with the inputs its kernels overwrite and the attentions fused."""
    b = OnnxBuilder(lower_unfused_attention(subgraph))
    subgraph = b.graph  # the unfused attentions' pieces and constants included
    for node in subgraph.nodes:
        emit_node(b, node)
    helper = b.helper
    used = {v for n in subgraph.nodes for v in n.inputs if v}
    external: dict[str, np.ndarray] = {}
    inits = list(b.initializers)
    for name, value in subgraph.constants.items():
        if name not in used:
            continue
        if value.nbytes >= EXTERNAL_CONSTANT_BYTES:
            external[name] = np.ascontiguousarray(value)
            inits.append(_external_placeholder(name, value))
        else:
            inits.append(b.numpy_helper.from_array(np.array(value, order="C", copy=None), name))  # keeps 0-d 0-d
    for name, value in b.large.items():
        external[name] = value
        inits.append(_external_placeholder(name, value))

    def info(v: str) -> Any:
        spec = subgraph.specs[v]
        return helper.make_tensor_value_info(v, ONNX_DTYPE[spec.dtype], list(spec.shape))

    nodes = b.live_nodes(list(subgraph.outputs))
    live = set().union(*(reads(n) for n in nodes))
    inits = [t for t in inits if t.name in live]
    external = {k: v for k, v in external.items() if k in live}
    graph = helper.make_graph(nodes, "edgerun_partition", [info(v) for v in subgraph.inputs],
                              [info(v) for v in subgraph.outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="edgerun")
    model.ir_version = 9
    drop_noop_reshapes(model)
    fold_expand_reshapes(model)
    kept = {t.name for t in model.graph.initializer}  # tidying may leave a constant unused
    return EmittedPartition(model, {k: v for k, v in external.items() if k in kept}, dict(b.overwrites),
                            sum(n.op == "cache_attention" for n in b.graph.nodes))


PLACEHOLDER_FILE = "edgerun-weights"
_PLACEHOLDER_FOLDER: str | None = None


def _external_placeholder(name: str, value: np.ndarray) -> Any:
    """An initializer with no bytes, marked external; make_session hands ORT its value as an OrtValue."""
    from onnx import TensorProto

    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = ONNX_DTYPE[DType.of(value)]
    tensor.dims.extend(value.shape)
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", PLACEHOLDER_FILE  # never read: the OrtValue replaces it
    return tensor


def _placeholder_folder() -> str:
    """A folder holding an empty file named like the placeholders' location. ORT checks that the external
    file of every initializer exists before it looks at the shared ones; it never reads it."""
    global _PLACEHOLDER_FOLDER
    if _PLACEHOLDER_FOLDER is None or not os.path.exists(os.path.join(_PLACEHOLDER_FOLDER, PLACEHOLDER_FILE)):
        import atexit
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="edgerun-ort-")
        open(os.path.join(folder, PLACEHOLDER_FILE), "wb").close()
        atexit.register(shutil.rmtree, folder, True)
        _PLACEHOLDER_FOLDER = folder
    return _PLACEHOLDER_FOLDER



def make_session(model: Any, external: dict[str, np.ndarray], threads: int,
                 spin: bool = False) -> ort.InferenceSession:
    """A session using the program's arrays in place: `add_initializer` shares them (no copy; ORT's kernels
    still prepack their own layouts from them). The few whose bytes ORT's graph optimisers read from the
    graph are copied in (`add_external_initializers`) instead: those `_read_by_optimizers` predicts, and
    any other one a failed attempt names. Copying them all instead cost ResNet-50 97 MB more at its load
    peak and left every weight resident twice."""
    values = {name: ort.OrtValue.ortvalue_from_numpy(value) for name, value in external.items()}
    shared = set(values) - _read_by_optimizers(model)
    for attempt in range(MAX_SHARING_ATTEMPTS):
        try:
            session = _session(model, values, threads, spin, shared)
            break
        except Exception as exc:
            if not shared:  # nothing left to copy in: the model itself fails
                raise
            needed = _initializer_read(str(exc))
            # An optimiser read that one: copy it in and try again; any other failure, copy them all.
            shared = shared - {needed} if needed in shared and attempt < MAX_SHARING_ATTEMPTS - 2 else set()
    hand_over(session, values, shared)
    return session


# A shared initializer that ORT needs the bytes of fails session creation with this, naming it.
_NEEDS_BYTES = re.compile(r"External initializer: (\S+) offset")
# Sessions attempted, each sharing fewer initializers, the last copying them all in.
MAX_SHARING_ATTEMPTS = 8


def _initializer_read(message: str) -> str | None:
    found = _NEEDS_BYTES.search(message)
    return found.group(1) if found else None


def _probe_session(model: Any, external: dict[str, np.ndarray]) -> ort.InferenceSession:
    """A one-thread session over `model` with `external` handed over as make_session does (onnx_prepacked.py)."""
    model.graph.initializer.extend(_external_placeholder(name, value) for name, value in external.items())
    return make_session(model, external, 1)


def _read_by_optimizers(model: Any) -> set[str]:
    """Initializers whose bytes ORT's graph optimisers read from the graph, so they must be copied in
    (add_external_initializers), not shared: those read by nodes whose inputs are all constant (constant
    folding), and Conv weights (the NCHWc layout transformer reorders them into new initializers)."""
    constant = {t.name for t in model.graph.initializer}
    read: set[str] = set()
    for node in model.graph.node:  # in topological order: a folded node's outputs are constants too
        ins = [i for i in node.input if i]
        if ins and all(i in constant for i in ins):
            read.update(ins)
            constant.update(node.output)
        elif node.op_type == "Conv" and node.domain in ("", "ai.onnx") and len(node.input) > 1:
            read.add(node.input[1])
    return read & {t.name for t in model.graph.initializer}


def _session(model: Any, values: dict[str, Any], threads: int, spin: bool,
             shared: set[str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # No QDQ fusion: ORT would rewrite dequantize -> add -> quantize into QLinearAdd, which rounds differently
    # from the program; the integer layers arrive already fused (QLinearConv, onnx_quant_ops.py).
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4 if shared else 3  # a failed sharing attempt is retried, not an error
    if shared:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         _placeholder_folder())
        for name in shared:
            options.add_initializer(name, values[name])
    copied = [name for name in values if name not in shared]
    if copied:
        options.add_external_initializers(copied, [values[name] for name in copied])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class BoundSession:
    """Runs a session on the caller's arrays through IO binding, rebinding only when the arrays change.

    The runtime calls `run` with the same two lists on every call (views of its arena, fixed at load), so
    the steady state is one identity check of each and ORT's C++ run, bound once with its arguments (each
    Python step here is a visible share of a tiny model's 30 us call). Arrays that are not C-contiguous go
    through a staging buffer.

    A session shared by partitions of one form at other sizes (onnx_shape_variants.py) may be replaced under
    a runner while another thread runs it (a template's new shape loading beside a cached one): `release`
    drops the runner's references and `adopt` or `rebuild` gives it the new session. A call already bound
    holds its own references (`_BoundCall`), so it finishes on the old session, which is freed after it; a
    call that binds meanwhile waits for the new one. The graph's values are bound by position to the
    session model's names.
    """

    def __init__(self, session: ort.InferenceSession, graph: Graph, external: dict[str, np.ndarray],
                 in_place: Mapping[str, np.ndarray] | None = None, overwrites: Mapping[str, str] | None = None,
                 model: Any = None) -> None:
        self.graph = graph
        self.closed = False  # released for good (`close`)
        # input -> the output its buffer is updated into (CompiledPartition.overwrites_inputs, reversed)
        self.overwritten = {read: out for out, read in (overwrites or {}).items()}
        self._ready = threading.Event()
        self._use(session, model, external, dict(in_place or {}))
        self.own = (model, tuple(self.in_place))  # what `rebuild` makes a session of again

    @classmethod
    def adopting(cls, other: BoundSession, graph: Graph, overwrites: Mapping[str, str]) -> BoundSession:
        """A runner of `graph` on `other`'s session (the same graph, compiled again)."""
        runner = cls(other.session, graph, other.external, other.in_place, overwrites, model=other.model)
        runner.own = other.own
        return runner

    @property
    def session(self) -> ort.InferenceSession | None:
        """The session this runner binds to; None while it is being replaced."""
        live = self._live
        return None if live is None else live[0]

    def _use(self, session: ort.InferenceSession, model: Any, external: dict[str, np.ndarray],
             in_place: dict[str, np.ndarray]) -> None:
        self.model = model
        self.external = external  # kept alive with the session
        self.in_place = in_place  # constants the model takes as inputs, bound with every binding
        names = [v.name for v in model.graph.input] if model is not None else list(self.graph.inputs)
        self.onnx_inputs = names[:len(self.graph.inputs)]
        self.onnx_outputs = [v.name for v in model.graph.output] if model is not None else list(self.graph.outputs)
        self._call: _BoundCall | None = None
        # The session and its binding, made here rather than on the first call (a first call is what the
        # search's warm-up times), as one value: a thread binding meanwhile reads both or neither.
        self._live: tuple[ort.InferenceSession, Any] | None = (session, session.io_binding())
        self._ready.set()

    def release(self) -> None:
        """Let go of the session (another is being built to replace it: `adopt` or `rebuild` follows)."""
        self._ready.clear()
        self._call = None
        self._live = None

    def close(self) -> None:
        """Let go of the session for good (CompiledPartition.release): it is freed once no other runner of
        its shape variants uses it, and a later compile never joins this runner. A run after this raises."""
        self.closed = True
        self.release()
        self.model = self.external = self.in_place = None  # type: ignore[assignment]
        self._ready.set()  # a run waiting for a new session wakes, finds none, and raises

    def adopt(self, other: BoundSession) -> None:
        """Run on `other`'s session, whose model is this runner's graph at other sizes (or the same)."""
        self._use(other.session, other.model, other.external, other.in_place)

    def rebuild(self, arrays: dict[str, np.ndarray], settings: tuple[Any, ...]) -> None:
        """A session of this runner's own model again, over `arrays` (its weights by name)."""
        threads, spin = settings
        model, in_place_names = self.own
        in_place = {name: arrays[name] for name in in_place_names}
        external = {name: a for name, a in arrays.items() if name not in in_place}
        self._use(make_session(model, external, threads, spin), model, external, in_place)

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        call = self._call
        if call is None or inputs is not call.inputs or outputs is not call.outputs:
            call = self._bind(inputs, outputs)
        call.run()

    def _bind(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> _BoundCall:
        live = self._live
        while live is None:  # being replaced: wait for the new session
            if self.closed:
                raise EdgerunError("this ONNX Runtime partition was released (LoadedProgram.release)")
            self._ready.wait()
            live = self._live
        session, binding = live
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        stage_in: list[tuple[np.ndarray, np.ndarray]] = []
        stage_out: list[tuple[np.ndarray, np.ndarray]] = []
        bound_out = {}
        for name, onnx_name, array in zip(self.graph.outputs, self.onnx_outputs, outputs):
            target = array
            if not array.flags.c_contiguous or not array.flags.writeable:
                target = np.empty(array.shape, array.dtype)
                stage_out.append((array, target))
            binding.bind_output(onnx_name, "cpu", 0, target.dtype, list(target.shape), _address(target))
            bound_out[name] = target
        for name, onnx_name, array in zip(self.graph.inputs, self.onnx_inputs, inputs):
            target = array
            updated = bound_out.get(self.overwritten.get(name, ""))
            if updated is not None and _address(updated) != _address(array):
                # The kernel appends to this input's buffer in place (GroupQueryAttention: past_key is
                # present_key): handed two arrays, it works on the output's, with the old value copied in.
                target = updated
                stage_in.append((target, array))
            elif not array.flags.c_contiguous:
                target = np.empty(array.shape, array.dtype)
                stage_in.append((target, array))
            binding.bind_input(onnx_name, "cpu", 0, target.dtype, list(target.shape), _address(target))
        for name, array in self.in_place.items():
            binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), _address(array))
        call = _BoundCall(inputs, outputs, session, binding, stage_in, stage_out)
        if self._live is live:  # not replaced meanwhile: keep it for the next calls
            self._call = call
        return call


class _BoundCall:
    """One binding of a runner's arrays to a session, and the callable that runs it: ORT's public
    session.run_with_iobinding bound to its arguments, or that wrapped in the staging copies."""

    __slots__ = ("_keep", "inputs", "outputs", "run")

    def __init__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], session: ort.InferenceSession,
                 binding: Any, stage_in: list[tuple[np.ndarray, np.ndarray]],
                 stage_out: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.inputs, self.outputs = inputs, outputs
        run_bound = functools.partial(session.run_with_iobinding, binding)
        self._keep = (session, binding, [d for d, _ in stage_in], [s for _, s in stage_out])
        if not stage_in and not stage_out:
            self.run: Callable[[], object] = run_bound
            return

        def run_staged() -> None:
            for dst, src in stage_in:
                np.copyto(dst, src)
            run_bound()
            for dst, src in stage_out:
                np.copyto(dst, src)

        self.run = run_staged


def _address(array: np.ndarray) -> int:
    # ORT rejects a null pointer even for empty tensors; any valid address will do for zero bytes.
    return int(array.ctypes.data) if array.size else int(np.empty(1, array.dtype).ctypes.data)
