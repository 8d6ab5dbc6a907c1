"""Calibration: a few micro-benchmarks per backend turn into the throughputs the cost model divides by.

Each benchmark is a tiny IR graph compiled and run through the backend exactly as the runtime runs it
(pre-bound nodes for arena backends, one call per partition for delegates): a matmul and a conv (flops/s),
exp (transcendental elementwise work), an add and a chain of adds (bytes/s inside a partition and across its
boundary: `_memory_rates`), 32 dependent tiny adds and a single one (seconds per node and per partition
call), a tiny MLP (per-node overhead of real kernels), the integer matmul and conv where the backend runs
them whole, each conv2d algorithm it offers (`algorithm_scale`: measured / modelled), and the alternative of
each open setting (`settings`: chosen when SETTING_GAIN faster over SETTING_BENCHMARKS, the benchmarks big
enough for a thread pool). docs/backends.md has the shapes and what each figure changed.

Times are medians of at least 5 runs, in 3 interleaved rounds: on a shared machine the typical run is what a user gets, and the
best run can be far from it (numpy's BLAS was seen at 1 and at 190 GFLOP/s on the same GEMM minutes apart).

It runs once per machine: profiles are cached as JSON under the device fingerprint, and a backend is
measured again only when its configuration (e.g. its thread count) differs from the cached one, or when
its profile was measured while other processes kept the machine busy and a load finds it quiet
(machine_load.py): a calibration taken busy corrects itself, with no cache deleted by hand.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, Throughput
from edgerun.backends.registry import get_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.conv_algorithms import Work
from edgerun.search import machine_load
from edgerun.search.fingerprint import (
    cache_dir,
    device_description,
    device_fingerprint,
    read_json,
    write_json,
)
from edgerun.search.machine_load import BusyProbe, worth_retaking

FORMAT = 7  # 2: medians over interleaved rounds; 3: `settings` (was `spin`); 4: compile times; 5: integer rates;
# 6: memory rate from a chain of adds (a delegate's copies at its boundary are its transfer cost); 7: only for a backend that copies at its boundary


@dataclass(frozen=True)
class BackendProfile:
    """What one backend achieves on this machine; every figure is measured unless `measured` is False."""

    gemm_flops_per_s: float
    conv_flops_per_s: float
    elementwise_flops_per_s: float
    bytes_per_s: float
    dispatch_s: float  # per node inside a partition
    partition_s: float  # per partition call, on top of its nodes
    transfer_bytes_per_s: float = math.inf  # host <-> backend memory (inf: it works on host memory)
    transfer_latency_s: float = 0.0
    config: str = ""
    measured: bool = True
    algorithm_scale: dict[str, float] = field(default_factory=dict)  # measured / modelled, per algorithm
    settings: dict[str, Any] = field(default_factory=dict)  # tunable setting -> the value calibration chose
    # Building a partition (compile): a fixed part, per node and per byte of weights. The first-load tuning
    # leaves out candidates whose build would overrun its budget (MNN converts a model in 0.6-10 s).
    compile_s: float = 0.0
    compile_s_per_node: float = 0.0
    compile_s_per_byte: float = 0.0
    # Integer matrix products (base.INTEGER_OPS); 0: not measured, the float gemm / conv rate stands in.
    integer_gemm_flops_per_s: float = 0.0
    integer_conv_flops_per_s: float = 0.0

    def compile_seconds(self, nodes: int, weight_bytes: int, partitions: int = 1) -> float:
        """Estimated seconds to build `partitions` partitions holding `nodes` nodes and `weight_bytes` of
        constants on this backend."""
        return partitions * self.compile_s + nodes * self.compile_s_per_node + weight_bytes * self.compile_s_per_byte

    @staticmethod
    def from_throughput(t: Throughput, partition_s: float = 0.0, config: str = "") -> BackendProfile:
        """The backend's own declared figures, for a backend that cannot be measured."""
        return BackendProfile(t.flops_per_s, t.flops_per_s, t.flops_per_s, t.bytes_per_s, t.dispatch_s,
                              partition_s, t.transfer_bytes_per_s, t.transfer_latency_s, config, measured=False,
                              integer_gemm_flops_per_s=t.integer_rate, integer_conv_flops_per_s=t.integer_rate)


def backend_config(backend: Backend) -> str:
    """What a backend's speed depends on, its library's version and its settings (a change means measuring again)."""
    return ",".join([backend.identity(), *(f"{key}={value}" for key, value in backend.settings().items())])


def calibration_path(fingerprint: str | None = None) -> Path:
    return cache_dir() / "calibration" / f"{fingerprint or device_fingerprint()}.json"


def load_profiles(backends: Sequence[Backend], *, recalibrate: bool = False,
                  measure: Callable[[Backend], BackendProfile] | None = None,
                  busy: BusyProbe | None = None) -> dict[str, BackendProfile]:
    """Profiles of `backends` on this machine: from the cache, measuring (and caching) the missing ones,
    and measuring again those taken while other processes kept the machine busy, once it is quiet
    (machine_load.py; `busy` probes it, default other_cpu_busy). `measure` is measure_backend unless a test
    injects another."""
    busy = busy or machine_load.other_cpu_busy
    path = calibration_path()
    cached = read_json(path) if not recalibrate else None
    valid = isinstance(cached, dict) and cached.get("format") == FORMAT
    stored: dict[str, Any] = cached.get("profiles", {}) if valid else {}  # type: ignore[union-attr]
    busy_when: dict[str, Any] = cached.get("busy", {}) if valid else {}  # type: ignore[union-attr]
    profiles: dict[str, BackendProfile] = {}
    changed = False
    for backend in backends:
        entry = stored.get(backend.name)
        if isinstance(entry, dict) and entry.get("config") == backend_config(backend) \
                and not worth_retaking(busy_when.get(backend.name), busy):
            try:
                profiles[backend.name] = BackendProfile(**entry)
                continue
            except TypeError:
                pass  # written by another version: measure again
        busy_when[backend.name] = busy()
        profiles[backend.name] = (measure or measure_backend)(backend)
        stored[backend.name] = asdict(profiles[backend.name])
        changed = True
    if changed:
        write_json(path, {"format": FORMAT, "device": device_description(), "profiles": stored, "busy": busy_when})
    return profiles


def calibrate(names: Sequence[str], *, recalibrate: bool = True) -> dict[str, BackendProfile]:
    """Measure the named backends now (the `edgerun calibrate` command) and cache the result."""
    return load_profiles([get_backend(n) for n in names], recalibrate=recalibrate)


# ---- the micro-benchmarks ------------------------------------------------------------------------------

ROUNDS = 3  # every benchmark is timed once per round, rounds interleaved, and the median round counts
SETTING_BENCHMARKS = ("gemm", "conv", "exp", "small")  # those that run on a thread pool (settings are threading)
# An alternative setting must win by this much (spinning, for one, also costs every other process a core).
SETTING_GAIN = 1.05
SETTING_BUDGET_S = 0.02  # per round for each alternative's run: enough for a median, and keeps calibration cheap


def calibrated(backend: Backend, profile: BackendProfile) -> Backend:
    """The backend with the settings calibration chose for it, among those it still leaves open (a copy:
    the shared instance keeps its own)."""
    return backend.with_settings(profile.settings)


def measure_backend(backend: Backend) -> BackendProfile:
    partition_s = backend.partition_overhead_s
    work = {"gemm": 2.0 * 128 * 256 * 512, "conv": 2.0 * 32 * 28 * 28 * 32 * 9, "exp": 8.0 * (1 << 18),
            "add": 3.0 * 4 * (1 << 20)}
    try:
        backend.compile(_add_chain(4, 1))  # one-time set-up (a first session, a converter's start) is not per graph
        built: dict[str, float] = {}  # compile seconds of the graphs that fix the compile-time figures
        calls = {"gemm": _runnable(backend, _gemm_graph(), built=built, label="gemm"),
                 "conv": _runnable(backend, _conv_graph(32, 32, 3, 1)),
                 "exp": _runnable(backend, _unary_graph("exp", 1 << 18)),
                 "add": _runnable(backend, _add_chain(1 << 20, 1)),
                 "add_chain": _runnable(backend, _add_chain(1 << 20, 1 + ADD_CHAIN_EXTRA)),
                 "chain": _runnable(backend, _add_chain(4, 32), built=built, label="chain"),
                 "single": _runnable(backend, _add_chain(4, 1), built=built, label="single")}
        algorithms = _algorithm_runs(backend)
        calls.update({name: call for name, (call, _) in algorithms.items()})
        calls["small"] = _runnable(backend, _small_mlp_graph())
        calls.update(_integer_runs(backend))
        alternatives = {name: values[1] for name, values in backend.tunable_settings().items() if len(values) > 1}
        for setting, value in alternatives.items():
            calls.update(_runs_with_setting(backend, setting, value))
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(ROUNDS):
            for name, call in calls.items():
                samples[name].append(_median_time(call, SETTING_BUDGET_S if "@" in name else 0.05))
    except Exception:  # a backend that cannot run the benchmarks keeps its declared figures
        return BackendProfile.from_throughput(backend.throughput, partition_s, backend_config(backend))
    t = {name: statistics.median(times) for name, times in samples.items()}
    chosen: dict[str, Any] = {}
    for setting, value in alternatives.items():
        gain = math.exp(statistics.mean(math.log(t[n] / t[f"{n}@{setting}"]) for n in SETTING_BENCHMARKS))
        chosen[setting] = value if gain >= SETTING_GAIN else backend.tunable_settings()[setting][0]
        if gain >= SETTING_GAIN:
            t.update({n: t[f"{n}@{setting}"] for n in SETTING_BENCHMARKS})
    dispatch = max((t["chain"] - t["single"]) / 31, 1e-8)
    partition = max(t["single"] - dispatch, 0.0)
    rate = {name: work[name] / max(t[name] - partition, 1e-9) for name in work}
    rate["add"], transfer_bytes_per_s = _memory_rates(t["add"] - partition, t["add_chain"] - partition,
                                                      work["add"], backend.throughput.transfer_bytes_per_s,
                                                      copies_at_boundary=backend.copies_at_boundary)
    small_work_s = SMALL_GEMM_FLOPS / rate["gemm"] + SMALL_TANH_FLOPS / rate["exp"]
    # A numpy matmul on a vector costs microseconds of overhead that an add on 4 floats does not show.
    dispatch = max(dispatch, (t["small"] - partition - small_work_s) / SMALL_NODES)
    th = backend.throughput
    integer = {name: INTEGER_WORK[name] / max(t[name] - partition, 1e-9) if name in t else th.integer_rate
               for name in INTEGER_WORK}
    profile = BackendProfile(rate["gemm"], rate["conv"], rate["exp"], rate["add"], dispatch, partition,
                             transfer_bytes_per_s, th.transfer_latency_s, backend_config(backend),
                             settings=chosen, compile_s=built["single"],
                             compile_s_per_node=max(built["chain"] - built["single"], 0.0) / 31,
                             compile_s_per_byte=max(built["gemm"] - built["single"], 0.0) / GEMM_WEIGHT_BYTES,
                             integer_gemm_flops_per_s=integer["int_gemm"], integer_conv_flops_per_s=integer["int_conv"])
    for name, (_, shape_work) in algorithms.items():
        profile.algorithm_scale[name] = t[name] / max(shape_work.seconds(profile), 1e-12)
    return profile


# Adds beyond the first in the chain that measures memory-bound work inside a partition.
ADD_CHAIN_EXTRA = 4
# Boundary copies under this share of the one-add call are noise, not a transfer cost.
BOUNDARY_SHARE = 0.25


def _memory_rates(one_s: float, chain_s: float, add_bytes: float, declared_transfer: float, *,
                  copies_at_boundary: bool = True) -> tuple[float, float]:
    """(bytes/s of memory-bound work inside a partition, bytes/s of its boundary copies, each way).

    The adds the chain has beyond the first give the first rate: a one-add call alone also counts a
    delegate's copies in and out of its own memory (MNN: 8 MB in, 4 MB out per call of a 1M-float add,
    six times the add itself), which made every op on MNN look memory-bound (DIN modelled at 270 us on MNN
    against 30 measured). What the one add costs beyond its share is the boundary: those same 12 MB moved
    once, unless it is a small share of the call (a backend on host memory), which keeps the declared rate.

    Only a backend whose partitions copy in and out of memory of their own (Backend.copies_at_boundary)
    is split so: on one that runs on the arena's own arrays (ONNX Runtime's bound arena views, the reference)
    the chain's later adds find their operands in cache, and the difference read as a boundary gave ONNX
    Runtime a transfer cost it does not have in some fresh calibrations (65.6 GB/s in one idle peers run,
    which put MiniLM on a measured-slower mix); such a backend keeps the one-add rate and its declared
    transfer rate."""
    per_add = (chain_s - one_s) / ADD_CHAIN_EXTRA
    if not copies_at_boundary or per_add <= 0:  # the chain measured no slower: nothing to separate
        return add_bytes / max(one_s, 1e-9), declared_transfer
    boundary_s = one_s - per_add
    transfer = add_bytes / boundary_s if boundary_s > BOUNDARY_SHARE * one_s else declared_transfer
    return add_bytes / per_add, transfer


def _runs_with_setting(backend: Backend, setting: str, value: object) -> dict[str, Callable[[], None]]:
    """The SETTING_BENCHMARKS compiled with `setting` = `value`, named "<benchmark>@<setting>"."""
    graphs = {"gemm": _gemm_graph(), "conv": _conv_graph(32, 32, 3, 1), "exp": _unary_graph("exp", 1 << 18),
              "small": _small_mlp_graph()}
    changed = backend.with_settings({setting: value})
    return {f"{name}@{setting}": _runnable(changed, graph) for name, graph in graphs.items()}


def _integer_runs(backend: Backend) -> dict[str, Callable[[], None]]:
    """The integer benchmarks this backend runs whole (it supports every node): none for a float-only one."""
    graphs = {"int_gemm": _int_gemm_graph(), "int_conv": _int_conv_graph()}
    return {name: _runnable(backend, g) for name, g in graphs.items() if all(backend.supports(n, g) for n in g.nodes)}


def _algorithm_runs(backend: Backend) -> dict[str, tuple[Callable[[], None], Work]]:
    """Per algorithm the backend offers for conv2d: a call running it on a shape it applies to, and its Work."""
    runs: dict[str, tuple[Callable[[], None], Work]] = {}
    for graph in (_conv_graph(64, 64, 1, 1), _conv_graph(64, 64, 3, 64), _conv_graph(32, 32, 3, 1)):
        node = graph.nodes[0]
        for choice in backend.algorithm_choices(node, graph):
            if choice.name not in runs:
                compiled = backend.compile_with_algorithms(graph, {node.name: choice.name})
                runs[choice.name] = (_runnable(backend, graph, compiled), choice.work)
    return runs


def _median_time(call: Callable[[], None], budget_s: float = 0.05, max_reps: int = 200) -> float:
    call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _runnable(backend: Backend, graph: Graph, compiled: CompiledPartition | None = None, *,
              built: dict[str, float] | None = None, label: str = "") -> Callable[[], None]:
    """A call running `graph` on `backend` as the runtime runs it; with `built`, its compile seconds are
    recorded there under `label`."""
    start = time.perf_counter()
    compiled = compiled or backend.compile(graph)
    if built is not None:
        built[label] = time.perf_counter() - start
    rng = np.random.default_rng(0)
    arrays = {v: (graph.constants[v] if v in graph.constants else
                  rng.integers(0, 256, s.shape).astype(s.dtype.np) if s.dtype is DType.uint8 else
                  rng.standard_normal(s.shape).astype(s.dtype.np)) for v, s in graph.specs.items()}
    if compiled.bind_node is not None:
        calls = [compiled.bind_node(n, arrays) for n in graph.nodes]

        def run_bound() -> None:
            with np.errstate(all="ignore"):
                for c in calls:
                    c()
        return run_bound
    ins = [arrays[v] for v in graph.inputs]
    outs = [arrays[v] for v in graph.outputs]
    return lambda: compiled.run(ins, outs)


def _f32(shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(shape, DType.float32)


def _graph(**inputs: TensorSpec) -> tuple[Graph, Builder]:
    """An empty benchmark graph with these inputs, and its builder."""
    g = Graph()
    for name, spec in inputs.items():
        g.add_input(name, spec)
    return g, Builder(g)


GEMM_WEIGHT_BYTES = 256 * 512 * 4  # _gemm_graph's constant


def _gemm_graph() -> Graph:
    g, b = _graph(x=_f32((128, 256)))
    w = b.const(np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32))
    g.outputs = [b.emit("matmul", ["x", w])]
    return g


def _conv_graph(c: int, o: int, k: int, groups: int) -> Graph:
    g, b = _graph(x=_f32((1, c, 28, 28)))
    w = b.const(np.random.default_rng(2).standard_normal((o, c // groups, k, k)).astype(np.float32))
    p = k // 2
    g.outputs = [b.emit("conv2d", ["x", w], padding=[p, p, p, p], groups=groups)]
    return g


SMALL_NODES = 8  # _small_mlp_graph: 4 matmuls and 4 tanh
SMALL_GEMM_FLOPS = 4 * 2.0 * 256 * 256
SMALL_TANH_FLOPS = 4 * 8.0 * 256


def _small_mlp_graph() -> Graph:
    g, b = _graph(x=_f32((1, 256)))
    v = "x"
    for seed in range(4):
        w = b.const(np.random.default_rng(seed).standard_normal((256, 256)).astype(np.float32) * 0.05)
        v = b.emit("tanh", [b.emit("matmul", [v, w])])
    g.outputs = [v]
    return g


def _unary_graph(op: str, n: int) -> Graph:
    g, b = _graph(x=_f32((n,)))
    g.outputs = [b.emit(op, ["x"])]
    return g


def _add_chain(n: int, length: int) -> Graph:
    g, b = _graph(x=_f32((n,)), y=_f32((n,)))
    v = "x"
    for _ in range(length):
        v = b.emit("add", [v, "y"])
    g.outputs = [v]
    return g


INTEGER_WORK = {"int_gemm": 2.0 * 128 * 256 * 512, "int_conv": 2.0 * 32 * 28 * 28 * 32 * 9}


def _int_weight(shape: tuple[int, ...], seed: int) -> np.ndarray:
    # Within +-63: 7-bit weights, as int8-static's reduce_range makes them (ONNX Runtime's u8s8 kernels are
    # exact on AVX2 only then, so its delegate claims no others).
    return np.random.default_rng(seed).integers(-63, 64, shape).astype(np.int8)


def _int_gemm_graph() -> Graph:
    g, b = _graph(x=TensorSpec((128, 256), DType.uint8))
    acc = b.emit("matmul_integer", ["x", b.const(_int_weight((256, 512), 1)), b.const(np.array(128, np.uint8)),
                                    b.const(np.zeros((), np.int8))])
    g.outputs = [b.emit("dequantize_linear", [acc, b.const(np.full(512, 1e-4, np.float32)),
                                              b.const(np.zeros((), np.int32))])]
    return g


def _int_conv_graph() -> Graph:
    g, b = _graph(x=TensorSpec((1, 32, 28, 28), DType.uint8))
    acc = b.emit("conv_integer", ["x", b.const(_int_weight((32, 32, 3, 3), 2)), b.const(np.array(128, np.uint8)),
                                  b.const(np.zeros((), np.int8))], padding=[1, 1, 1, 1], groups=1)
    acc = b.emit("add", [acc, b.const(np.arange(32, dtype=np.int32).reshape(32, 1, 1))])
    g.outputs = [b.emit("requantize", [acc, b.const(np.full((32, 1, 1), 1e-3, np.float32)),
                                       b.const(np.array(128, np.uint8))], arithmetic="float32")]
    return g
