"""Per-instruction dispatch overhead of the runtime on a chain of tiny elementwise ops (docs/benchmarks.md).

Workload: y = x + c0 + c1 + ... + c{n-1} on float32[4], n = 200: every instruction is a bound `np.add`.
Method (medians over repeated calls):
  call(n)      one LoadedProgram call of the n-add chain (input copy, errstate, loop, output copy)
  call(0)      the same on a program with no instruction: the fixed cost of one call
  kernels(n)   n `np.add(a, b, out)` calls in the tightest Python loop (`for _ in range(n)`, local names)
  empty(n)     the executor's loop over n no-op calls (the loop and call cost with no kernel)
  dispatch overhead per instruction = (call(n) - call(0) - kernels(n)) / n
Also: the profiled loop (an event sink recording every instruction) and the plain interpreter, per op.

    .venv/bin/python bench/dispatch_overhead.py [--ops 200] [--repeats 2000]

Last line: `dispatch_overhead_us=<x> per_instruction_us=<y>`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.runtime import EventRecorder, load
from edgerun.runtime.executor import Executor
from edgerun.runtime.instructions import Instruction

SIZE = 4


def chain(n: int) -> Graph:
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((SIZE,), DType.float32))
    for i in range(n):
        v = b.emit("add", [v, b.const(np.full(SIZE, i, np.float32))])
    g.outputs = [v]
    return g


def median_seconds(fn: Callable[[], object], repeats: int, batch: int = 20) -> float:
    """Median over `repeats // batch` batches of the mean time of `batch` calls (after a warm-up)."""
    for _ in range(batch):
        fn()
    samples = []
    clock = time.perf_counter
    for _ in range(max(1, repeats // batch)):
        start = clock()
        for _ in range(batch):
            fn()
        samples.append((clock() - start) / batch)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    n = args.ops
    x = np.ones(SIZE, np.float32)

    m = load(chain(n))
    m0 = load(chain(0))
    assert len(m.instructions) == n
    call_n = median_seconds(lambda: m(x), args.repeats)
    call_0 = median_seconds(lambda: m0(x), args.repeats)

    a, b, o = np.ones(SIZE, np.float32), np.ones(SIZE, np.float32), np.empty(SIZE, np.float32)
    add = np.add

    def bare_kernels() -> None:
        for _ in range(n):
            add(a, b, o)
    kernels = median_seconds(bare_kernels, args.repeats)

    noop = Executor([Instruction(lambda: None, "noop", f"n{i}", "none", 0, (), ()) for i in range(n)])
    empty = median_seconds(noop.run, args.repeats)
    empty0 = median_seconds(Executor([]).run, args.repeats)

    recorder = EventRecorder()

    def profiled() -> None:
        recorder.clear()
        m.run([x], sink=recorder)
    prof = median_seconds(profiled, args.repeats // 4)
    graph = chain(n)
    interp = median_seconds(lambda: interpret(graph, [x]), max(40, args.repeats // 20), batch=4)

    dispatch = (call_n - call_0 - kernels) / n
    rows = [
        ("call(n): one call of the chain", call_n * 1e6, call_n / n * 1e6),
        ("call(0): fixed cost of a call", call_0 * 1e6, float("nan")),
        ("kernels(n): n np.add calls, tightest loop", kernels * 1e6, kernels / n * 1e6),
        ("empty(n): executor loop, no-op calls", (empty - empty0) * 1e6, (empty - empty0) / n * 1e6),
        ("dispatch overhead: call(n)-call(0)-kernels(n)", dispatch * n * 1e6, dispatch * 1e6),
        ("profiled call (EventRecorder sink)", prof * 1e6, (prof - call_0) / n * 1e6),
        ("plain interpreter (interpret)", interp * 1e6, interp / n * 1e6),
    ]
    print(f"chain of {n} float32[{SIZE}] adds; medians; {platform.processor() or platform.machine()}")
    print(f"{'measurement':48s} {'total us':>10s} {'us / op':>9s}")
    for label, total, per in rows:
        print(f"{label:48s} {total:10.1f} {per:9.3f}")
    out = Path(__file__).parent / "results" / "dispatch_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "ops": n, "size": SIZE, "python": platform.python_version(), "numpy": np.__version__,
        "call_us": call_n * 1e6, "call0_us": call_0 * 1e6, "kernels_us": kernels * 1e6,
        "empty_loop_us_per_op": (empty - empty0) / n * 1e6, "dispatch_overhead_us": dispatch * 1e6,
        "per_instruction_us": call_n / n * 1e6, "profiled_us_per_op": (prof - call_0) / n * 1e6,
        "interpreter_us_per_op": interp / n * 1e6}, indent=2) + "\n")
    print(f"dispatch_overhead_us={dispatch * 1e6:.3f} per_instruction_us={call_n / n * 1e6:.3f}")


if __name__ == "__main__":
    main()
