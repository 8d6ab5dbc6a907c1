"""Dynamic shapes: one template program per model against a static export per shape (docs/benchmarks.md).

For each model (zoo resnet18 with dynamic batch, height and width; zoo minilm_l6 with dynamic batch and
sequence length) the model is exported once with bounded torch.export.Dims, and once statically at each of
three shapes. Per shape:
- first call: a freshly loaded template's first call at that shape (bind, specialise, run the export
  pipeline, load, run), against the static program's load plus its first call (what a static user pays
  for the same first result, re-export excluded); the specialisation alone (substitution and the pass
  pipeline) is timed too;
- steady state: the median call once both are warm.
Medians over --rounds fresh loads (first call) and --runs calls (steady state), default backends
(reference), one BLAS thread unless --threads says otherwise; steady-state calls of the two programs are
interleaved so both see the same load. Ratios are template / static.

    .venv/bin/python bench/dynamic_shapes.py [--models resnet18,minilm_l6] [--runs 20] [--rounds 3]

Then ONNX models from PyPI wheels imported with no shape arguments (`from_onnx(path)`; one of them, PP-OCRv4's
recognizer, holds a guard checked at each new size), saved, and loaded from the file: per size, the first call
of a freshly loaded program (guards checked, specialised from the file's IR, loaded, run) against a program
imported with that size pinned (its load plus first call), the specialisation alone, and the median later call
of each (interleaved).

    .venv/bin/python bench/dynamic_shapes.py --onnx ocr-v4-rec,silero-op15,ocr-cls-mobile

(`--onnx ""` leaves them out; the models are bench/unsized_wheel_models.py's, skipped when their wheel is
absent). Then the call overhead a template adds, on a one-node program where no kernel hides it (2000 calls).

Writes bench/results/dynamic_shapes.json. Last line: `max_steady_ratio=<x> max_first_call_ratio=<y>`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _resnet_case() -> tuple[Any, Callable[[tuple[int, ...]], tuple[Any, ...]], Any, list[tuple[int, ...]]]:
    import torch
    from torch.export import Dim

    from edgerun import zoo
    from edgerun.zoo.inputs import natural_image

    model = zoo.get("resnet18").build()

    def inputs(shape: tuple[int, ...]) -> tuple[Any, ...]:
        batch, size = shape
        return (natural_image(size, seed=size, batch=batch).to(torch.float32),)

    dims = ({0: Dim("batch", min=1, max=8), 2: Dim("h", min=64, max=320), 3: Dim("w", min=64, max=320)},)
    return model, inputs, dims, [(1, 128), (2, 224), (4, 288)]


def _minilm_case() -> tuple[Any, Callable[[tuple[int, ...]], tuple[Any, ...]], Any, list[tuple[int, ...]]]:
    from torch.export import Dim

    from edgerun import zoo
    from edgerun.zoo.minilm import EXAMPLE_SENTENCES, tokenize

    model = zoo.get("minilm_l6").build()

    def inputs(shape: tuple[int, ...]) -> tuple[Any, ...]:
        batch, seq = shape
        return tokenize([EXAMPLE_SENTENCES[i % len(EXAMPLE_SENTENCES)] for i in range(batch)], length=seq)

    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=128)
    return model, inputs, tuple({0: batch, 1: seq} for _ in inputs((2, 8))), [(1, 16), (2, 64), (4, 128)]


CASES = {"resnet18": _resnet_case, "minilm_l6": _minilm_case}


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def _steady(models: list[Any], arrays: list[np.ndarray], runs: int) -> list[float]:
    """Median call time of each model, calls interleaved so that both see the same load on a shared box."""
    times: list[list[float]] = [[] for _ in models]
    for m in models:
        m(*arrays)
    for _ in range(runs):
        for m, t in zip(models, times):
            start = time.perf_counter()
            m(*arrays)
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def bench_model(name: str, runs: int, rounds: int, workdir: Path) -> list[dict[str, Any]]:
    import edgerun
    from edgerun.runtime.specializing import specialize_program

    model, make_inputs, dims, shapes = CASES[name]()
    example = make_inputs((2, shapes[0][1]))
    template_path = workdir / f"{name}.template.edgerun"
    export_s, program = _timed(functools.partial(edgerun.export, dynamic_shapes=dims), model, example)
    program.save(template_path)
    print(f"{name}: template exported in {export_s:.1f} s, symbols {program.graph.symbols}", flush=True)
    rows = []
    for shape in shapes:
        torch_inputs = make_inputs(shape)
        arrays = [t.numpy() for t in torch_inputs]
        static_path = workdir / f"{name}.{'x'.join(map(str, shape))}.edgerun"
        static_export_s, static_program = _timed(edgerun.export, model, torch_inputs)
        static_program.save(static_path)
        firsts, static_loads, static_firsts = [], [], []
        for _ in range(rounds):
            template = edgerun.load(template_path)
            firsts.append(_timed(template, *arrays)[0])
            load_s, static = _timed(edgerun.load, static_path)
            static_loads.append(load_s)
            static_firsts.append(_timed(static, *arrays)[0])
        bindings = dict(template.specialization(arrays).program.metadata["specialized_from"]["symbols"])
        specialise_s = statistics.median(_timed(specialize_program, program, bindings)[0] for _ in range(rounds))
        ours = template(*arrays)
        theirs = static(*arrays)
        pairs = zip(ours, theirs) if isinstance(ours, tuple) else [(ours, theirs)]
        max_diff = max(float(np.abs(a - b).max()) for a, b in pairs)
        row = {
            "model": name, "shape": list(shape),
            "template_first_call_ms": statistics.median(firsts) * 1e3,
            "specialise_ms": specialise_s * 1e3,
            "static_load_ms": statistics.median(static_loads) * 1e3,
            "static_first_call_ms": statistics.median(static_firsts) * 1e3,
            **dict(zip(("template_steady_ms", "static_steady_ms"),
                       (t * 1e3 for t in _steady([template, static], arrays, runs)))),
            "static_export_s": static_export_s,
            "max_abs_diff_template_vs_static": max_diff,
            "arena_bytes": template.specialization(arrays).plan.arena_bytes,
            "static_arena_bytes": static.plan.arena_bytes,
        }
        static_first = row["static_load_ms"] + row["static_first_call_ms"]
        row["first_call_ratio"] = row["template_first_call_ms"] / static_first
        row["steady_ratio"] = row["template_steady_ms"] / row["static_steady_ms"]
        rows.append(row)
        print(f"{name:10s} {tuple(shape)!s:14s} {row['template_first_call_ms']:9.1f} {row['specialise_ms']:8.1f} "
              f"{static_first:9.1f} "
              f"{row['first_call_ratio']:6.2f} {row['template_steady_ms']:9.2f} {row['static_steady_ms']:9.2f} "
              f"{row['steady_ratio']:6.3f} {row['arena_bytes'] == row['static_arena_bytes']!s:>6s}", flush=True)
    return rows


def bench_onnx(label: str, runs: int, rounds: int, workdir: Path) -> list[dict[str, Any]]:
    """One wheel model imported with no shape arguments, against a program with each size pinned."""
    import edgerun
    from edgerun.frontends.onnx import from_onnx
    from edgerun.ir.specialize import guards
    from edgerun.program import Program
    from edgerun.runtime.specializing import specialize_program

    sys.path.insert(0, str(Path(__file__).parent))
    from unsized_wheel_models import MODELS, _feeds, wheel_file

    package, relative, sizes, frozen = MODELS[label]
    path = wheel_file(package, relative)
    if path is None:
        print(f"{label}: skipped, {package} is not installed", flush=True)
        return []
    constants = {k: np.array(v) for k, v in frozen.items()} or None
    template_path = workdir / f"{label}.edgerun"
    import_s, program = _timed(functools.partial(from_onnx, constant_inputs=constants), str(path))
    program.save(template_path)
    saved = Program.read(template_path)
    checked = [o for g in (saved.graph, *saved.graph.subgraphs.values()) for o, _, _ in guards(g)]
    print(f"onnx:{label}: imported with no shape arguments in {import_s:.1f} s, symbols {saved.graph.symbols}, "
          f"{len(checked)} guards", flush=True)
    rows = []
    for k, size in enumerate(sizes):
        feeds = _feeds(size, k)
        pinned_path = workdir / f"{label}.{k}.edgerun"
        from_onnx(str(path), input_shapes=size, constant_inputs=constants).save(pinned_path)
        firsts, pinned_loads, pinned_firsts = [], [], []
        for _ in range(rounds):
            template = edgerun.load(template_path)
            firsts.append(_timed(functools.partial(template, **feeds))[0])
            load_s, pinned = _timed(edgerun.load, pinned_path)
            pinned_loads.append(load_s)
            pinned_firsts.append(_timed(functools.partial(pinned, **feeds))[0])
        bindings = dict(template.specialization(feeds).program.metadata["specialized_from"]["symbols"])
        specialise_s = statistics.median(_timed(specialize_program, saved, bindings)[0] for _ in range(rounds))
        ours, theirs = template(**feeds), pinned(**feeds)
        pairs = zip(ours, theirs) if isinstance(ours, tuple | list) else [(ours, theirs)]
        steady = _steady([functools.partial(template, **feeds), functools.partial(pinned, **feeds)], [], runs)
        row = {
            "model": f"onnx:{label}", "shape": {n: list(v) for n, v in size.items()}, "guards": len(checked),
            "template_first_call_ms": statistics.median(firsts) * 1e3,
            "specialise_ms": specialise_s * 1e3,
            "static_load_ms": statistics.median(pinned_loads) * 1e3,
            "static_first_call_ms": statistics.median(pinned_firsts) * 1e3,
            "template_steady_ms": steady[0] * 1e3, "static_steady_ms": steady[1] * 1e3,
            "max_abs_diff_template_vs_static": max(float(np.abs(a - b).max()) for a, b in pairs),
        }
        static_first = row["static_load_ms"] + row["static_first_call_ms"]
        row["first_call_ratio"] = row["template_first_call_ms"] / static_first
        row["steady_ratio"] = row["template_steady_ms"] / row["static_steady_ms"]
        rows.append(row)
        first_shape = next(iter(size.values()))
        print(f"{label:16s} {first_shape!s:16s} {row['template_first_call_ms']:9.1f} {row['specialise_ms']:8.1f} "
              f"{static_first:9.1f} {row['first_call_ratio']:6.2f} {row['template_steady_ms']:9.2f} "
              f"{row['static_steady_ms']:9.2f} {row['steady_ratio']:6.3f}", flush=True)
    return rows


def call_overhead_us(calls: int = 2000) -> dict[str, float]:
    """What a template adds to each call, measured on a one-node program (relu on float32[n, 64]), where the
    kernel is too small to hide it: median per-call time of the template and the static program."""
    import edgerun
    from edgerun.ir.builder import Builder
    from edgerun.ir.dtypes import DType
    from edgerun.ir.graph import Graph
    from edgerun.ir.symbolic import sym
    from edgerun.ir.tensor_spec import TensorSpec
    from edgerun.program import Program

    def tiny(dim: Any, symbols: dict[str, tuple[int, int]]) -> Any:
        g = Graph(symbols=symbols)
        x = g.add_input("x", TensorSpec((dim, 64), DType.float32))
        g.outputs = [Builder(g).emit("relu", [x])]
        return edgerun.load(Program(g))

    template, static = tiny(sym("n"), {"n": (1, 64)}), tiny(8, {})
    x = np.ones((8, 64), np.float32)
    per_call: list[list[float]] = [[], []]
    for _ in range(20):
        for model, out in zip((template, static), per_call):
            start = time.perf_counter()
            for _ in range(calls // 20):
                model(x)
            out.append((time.perf_counter() - start) / (calls // 20))
    t, s = (statistics.median(v) * 1e6 for v in per_call)
    return {"template_call_us": t, "static_call_us": s, "added_us": t - s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,minilm_l6", help=f"comma-separated, from {sorted(CASES)}")
    parser.add_argument("--runs", type=int, default=20, help="steady-state calls per shape (median)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh loads per shape for first-call times (median)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (1 keeps a shared box's noise down)")
    parser.add_argument("--onnx", default="ocr-v4-rec,silero-op15,ocr-cls-mobile",
                        help="comma-separated wheel models (bench/unsized_wheel_models.py) imported with no shapes")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)
    load_before = os.getloadavg()
    print(f"{'model':10s} {'shape':14s} {'1st tmpl':>9s} {'of it sp':>8s} {'1st stat':>9s} {'ratio':>6s} "
          f"{'steady t':>9s} {'steady s':>9s} {'ratio':>6s} {'arena=':>6s}")
    print("(ms; 1st tmpl: the template's first call at the shape, 'of it sp' the specialisation (substitute and "
          "pass pipeline) inside it; 1st stat: the static program's load plus first call; arena=: same arena bytes)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, args.models.split(",")):
            rows += bench_model(name, args.runs, args.rounds, Path(tmp))
        if args.onnx:
            print("ONNX models imported with no shape arguments, loaded from their program files; 'stat' is a "
                  "program imported with the size pinned:")
        for label in filter(None, args.onnx.split(",")):
            rows += bench_onnx(label, args.runs, args.rounds, Path(tmp))
    overhead = call_overhead_us()
    print(f"call overhead on a one-node program: template {overhead['template_call_us']:.1f} us, static "
          f"{overhead['static_call_us']:.1f} us, added {overhead['added_us']:.1f} us per call")
    out = Path(__file__).parent / "results" / "dynamic_shapes.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["bench/dynamic_shapes.py", *sys.argv[1:]]),
                               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                               "python": sys.version.split()[0], "load_average_before": load_before,
                               "load_average_after": os.getloadavg(), "runs": args.runs, "rounds": args.rounds,
                               "threads": args.threads, "call_overhead": overhead,
                               "rows": rows}, indent=2) + "\n")
    print(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"max_steady_ratio={max(r['steady_ratio'] for r in rows):.3f} "
          f"max_first_call_ratio={max(r['first_call_ratio'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
