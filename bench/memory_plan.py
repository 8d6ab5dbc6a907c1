"""Arena size per zoo model: the planned arena against the lower bound and the naive sum (docs/benchmarks.md).

Each model is exported (torch frontend), optimised with the default pass pipeline, and loaded; the plan is
proved safe by verify_plan. Columns: planned values, the arena (best of the planner suite), the lower bound
(peak bytes of simultaneously live values), the naive sum (every value its own bytes), arena / bound,
arena / naive, the winning algorithm, how many reshapes were elided as aliases, and load time (median of 5).

    .venv/bin/python bench/memory_plan.py [--models resnet18,vit_tiny]

Last line: `max_ratio_to_lower_bound=<x> mean_arena_over_naive=<y>`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from edgerun import zoo
from edgerun.frontends.torch.export import export
from edgerun.passes.pipeline import optimize
from edgerun.runtime import load
from edgerun.runtime.plan_verifier import verify_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else zoo.list_models()
    header = (f"{'model':15s} {'values':>6s} {'arena B':>12s} {'bound B':>12s} {'naive B':>13s} "
              f"{'/bound':>7s} {'/naive':>7s} {'algorithm':>17s} {'alias':>5s} {'load ms':>8s}")
    print(header)
    rows = []
    for name in names:
        model = zoo.get(name)
        graph, _ = optimize(export(model.build(), model.example_inputs()).graph)
        loads = []
        for _ in range(5):
            start = time.perf_counter()
            m = load(graph)
            loads.append(time.perf_counter() - start)
        plan = m.plan
        verify_plan(plan)
        row = {"model": name, "values": len(plan.values), "arena_bytes": plan.arena_bytes,
               "lower_bound_bytes": plan.lower_bound, "naive_bytes": plan.naive_bytes,
               "ratio_to_lower_bound": plan.ratio_to_lower_bound, "arena_over_naive": plan.arena_bytes / plan.naive_bytes,
               "algorithm": plan.algorithm, "candidates": plan.candidates, "aliases": len(plan.aliases),
               "load_ms": statistics.median(loads) * 1e3}
        rows.append(row)
        print(f"{name:15s} {row['values']:6d} {plan.arena_bytes:12,d} {plan.lower_bound:12,d} "
              f"{plan.naive_bytes:13,d} {row['ratio_to_lower_bound']:7.3f} {row['arena_over_naive']:7.3f} "
              f"{plan.algorithm:>17s} {row['aliases']:5d} {row['load_ms']:8.1f}", flush=True)
    out = Path(__file__).parent / "results" / "memory_plan.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"python": sys.version.split()[0], "models": rows}, indent=2) + "\n")
    print(f"max_ratio_to_lower_bound={max(r['ratio_to_lower_bound'] for r in rows):.3f} "
          f"mean_arena_over_naive={statistics.mean(r['arena_over_naive'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
