"""`edgerun run | info | plan | bench`: run a program file, describe it, show its placement, time it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.registry import get_op


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("run", help="run a program file on inputs from an .npz (or random ones)")
    p.add_argument("file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", help=".npz whose keys are the program's input names")
    src.add_argument("--random", action="store_true", help="make inputs from the input specs")
    p.add_argument("--seed", type=int, default=0, help="seed for --random")
    p.add_argument("--out", help="write outputs to this .npz (keys: output names); else print a summary")
    _add_backend_args(p)
    p.set_defaults(func=_run)

    p = subparsers.add_parser("info", help="ops by kind, weights, arena against naive sum and lower bound, passes")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_info)

    p = subparsers.add_parser("plan", help="placement table: partitions, backends, op counts, estimated vs measured")
    p.add_argument("file")
    p.add_argument("--runs", type=int, default=5, help="profiled runs per measurement (median)")
    p.add_argument("--no-measure", action="store_true", help="estimates only")
    _add_backend_args(p)
    p.set_defaults(func=_plan)

    p = subparsers.add_parser("bench", help="median latency over N runs after warm-up, on random inputs")
    p.add_argument("file")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_backend_args(p)
    p.set_defaults(func=_bench)


def _add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", default="reference",
                   help="comma-separated preference list (default: reference); reference takes the rest; "
                        "'auto' lets the load-time search place every node")
    p.add_argument("--placement", help="JSON file {node name: backend} of forced placements")
    p.add_argument("--tune", action="store_true", help="with --backends auto: measure the best candidate "
                                                       "placements and cache the winner for this device")


def _load(args: argparse.Namespace) -> Any:
    from edgerun.search import load  # the runtime's load, with "auto" resolved by the search

    path = Path(args.file)
    if not path.is_file():
        raise EdgerunError(f"no program file at {path}")
    placement = None
    if getattr(args, "placement", None):
        placement = json.loads(Path(args.placement).read_text())
        if not isinstance(placement, dict):
            raise EdgerunError("--placement must hold a JSON object {node name: backend}")
    spec = getattr(args, "backends", "reference")
    backends = spec if spec.startswith("auto") else [b.strip() for b in spec.split(",") if b.strip()]
    from edgerun.cli.progress import Progress

    with Progress(f"loading {path}" + (f" (backends {spec})" if spec != "reference" else "")):
        return load(path, backends=backends, placement=placement, tune=getattr(args, "tune", False))


def _run(args: argparse.Namespace) -> int:
    from edgerun.runtime.report import random_inputs

    m = _load(args)
    if args.random:
        inputs = random_inputs(m.graph, args.seed)
    else:
        from edgerun.devtools.programs import read_arrays

        inputs = read_arrays(args.inputs)
    outputs = dict(zip(m.output_names, m.run(inputs)))
    if args.out:
        np.savez(args.out, **outputs)  # type: ignore[arg-type]
        print(f"wrote {len(outputs)} outputs to {args.out}", file=sys.stderr)
    else:
        for name, value in outputs.items():
            flat = value.reshape(-1)
            head = np.array2string(flat[:6], precision=5, separator=", ")
            print(f"{name}: {value.dtype}{list(value.shape)} {head}{' ...' if flat.size > 6 else ''}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from edgerun.ir.symbolic import evaluate
    from edgerun.program import Program
    from edgerun.runtime import LoadedProgram, load
    from edgerun.runtime.specializing import SpecializingProgram

    program = Program.read(args.file)
    graph = program.graph
    by_kind: dict[str, dict[str, int]] = {}
    for op, count in graph.op_counts().items():
        by_kind.setdefault(get_op(op).kind.value, {})[op] = count
    m = load(program)
    largest = {name: high for name, (_, high) in graph.symbols.items()}
    if isinstance(m, SpecializingProgram):  # a template: show the plan for the largest shape its bounds allow
        m = m.specialization(**{n: tuple(evaluate(d, largest) for d in graph.specs[n].shape) for n in graph.inputs})
    if not isinstance(m, LoadedProgram):
        raise EdgerunError(f"{args.file} runs in stages (data-dependent ops): each stage has a plan of its own")
    plan = m.plan
    info: dict[str, Any] = {
        "symbols": {name: list(bounds) for name, bounds in graph.symbols.items()},
        "nodes": len(graph.nodes), "ops_by_kind": by_kind,
        "inputs": {n: str(graph.specs[n]) for n in graph.inputs},
        "outputs": {n: str(graph.specs[n]) for n in graph.outputs},
        "weights_bytes": graph.weight_bytes(), "constants": len(graph.constants),
        "arena_bytes": plan.arena_bytes, "arena_lower_bound_bytes": plan.lower_bound,
        "arena_naive_bytes": plan.naive_bytes, "planner": plan.algorithm,
        "instructions": len(m.instructions), "program_hash": program.program_hash(),
        "passes": program.metadata.get("passes"),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from edgerun.runtime.report import format_memory_plan

    print(f"{args.file}: {info['nodes']} nodes, {info['constants']} constants, "
          f"{info['weights_bytes']:,} B of weights (memory-mapped)")
    for name, spec in info["inputs"].items():
        print(f"  input  {name}: {spec}")
    for name, spec in info["outputs"].items():
        print(f"  output {name}: {spec}")
    if largest:
        print("template: symbols " + ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in graph.symbols.items())
              + "; specialised per shape at run time, the plan below is for the largest shape ("
              + ", ".join(f"{k}={v}" for k, v in largest.items()) + ")")
    for kind, ops in sorted(by_kind.items()):
        print(f"{kind}: {sum(ops.values())} nodes  " + ", ".join(f"{op} {n}" for op, n in ops.items()))
    print(f"runtime: {info['instructions']} instructions after decomposition and reshape elision")
    print(format_memory_plan(m))
    _print_passes(program.metadata.get("passes"))
    return 0


def _print_passes(data: Any) -> None:
    if not data:
        print("passes: none recorded in the program metadata")
        return
    try:
        from edgerun.passes.pipeline import format_pass_table, records_from_json

        print(format_pass_table(records_from_json(data)))
    except (ImportError, ValueError) as exc:
        print(f"passes: unreadable records ({exc})")


def _plan(args: argparse.Namespace) -> int:
    from edgerun.runtime.report import format_placement_table, partition_costs, random_inputs

    m = _load(args)
    inputs = None if args.no_measure else random_inputs(m.graph)
    print(format_placement_table(partition_costs(m, inputs, max(1, args.runs))))
    _print_candidates(m.search)
    return 0


def _print_candidates(plan: object) -> None:
    """The placements the load-time search considered: modelled against measured time, winner marked."""
    from edgerun.search import AutoPlan

    if not isinstance(plan, AutoPlan):
        return
    tuning = plan.tuning
    if tuning.get("source") == "cache":
        print("search: placement from the tuning cache (measured on an earlier load of this program here)")
        return
    print(f"search: {len(plan.placement)} nodes over {', '.join(plan.backends)}; "
          f"modelled {plan.modelled_s * 1e3:.3f} ms, search {plan.search_s * 1e3:.1f} ms")
    if not tuning.get("candidates"):
        return
    # Two different timings, so two names: the table above profiles each partition now (the runtime's work
    # between partitions left out); the search timed whole calls of each candidate while it loaded.
    print("candidates the search timed while loading (whole calls; the table above times each partition now):")
    print("candidate                    modelled ms  load-time call ms")
    for c in tuning["candidates"]:
        measured = "-" if c["measured_s"] is None else f"{c['measured_s'] * 1e3:.3f}"
        mark = "  <- chosen" if c["label"] == tuning.get("winner") else ""
        print(f"{c['label']:<28} {c['modelled_s'] * 1e3:>11.3f}  {measured:>17}{mark}")


def _bench(args: argparse.Namespace) -> int:
    from edgerun.runtime.report import random_inputs

    t0 = time.perf_counter()
    m = _load(args)
    load_s = time.perf_counter() - t0
    inputs = random_inputs(m.graph)
    for _ in range(max(0, args.warmup)):
        m.run(inputs)
    times = []
    for _ in range(max(1, args.runs)):
        start = time.perf_counter()
        m.run(inputs)
        times.append(time.perf_counter() - start)
    times.sort()
    result = {"file": args.file, "runs": len(times), "load_ms": load_s * 1e3,
              "median_ms": statistics.median(times) * 1e3, "p10_ms": times[len(times) // 10] * 1e3,
              "p90_ms": times[min(len(times) - 1, (len(times) * 9) // 10)] * 1e3,
              "instructions": len(m.instructions), "arena_bytes": m.plan.arena_bytes}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.file}: median {result['median_ms']:.3f} ms over {len(times)} runs "
              f"(p10 {result['p10_ms']:.3f}, p90 {result['p90_ms']:.3f}; load {result['load_ms']:.1f} ms, "
              f"{result['instructions']} instructions)")
    return 0
