"""The fault-injection proof as a table (docs/devtools.md): per injected bug, whether random-input unit tests
catch it, whether carved tests on realistic inputs catch it, which op `migrate` names, and how many whole-model
runs and seconds localisation took.

Models: the proof model (edgerun/devtools/fault_proof.py: every op a bug lives in, padded token features with
outlier channels), and, unless --proof-only, the zoo's Llama-style decoder (prompts) and MiniLM (real
weights, real sentences), exported with edgerun.frontends.torch. On zoo models only bugs whose op the
model contains are run.

    .venv/bin/python bench/fault_injection.py [--proof-only] [--inputs 2]
    .venv/bin/python bench/fault_injection.py --render    # reprint the tables from the saved JSON

Writes bench/results/fault_injection.json; prints markdown tables. "Model runs" counts whole-model
executions (one per realistic input set per validation, the pure-source run included) until migrate stopped.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from edgerun.backends.faulty import BUGS, FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.devtools.carve import carve
from edgerun.devtools.fault_proof import (
    FAULTY_OP,
    FaultRow,
    fault_row,
    proof_loaded,
    proof_table,
    realistic_inputs,
)
from edgerun.devtools.migrate import migrate
from edgerun.devtools.programs import InputSet, LoadedGraph, load_graph
from edgerun.devtools.random_tests import random_unit_tests


def run_model_rows(name: str, loaded: LoadedGraph, inputs: list[InputSet]) -> dict[str, object]:
    start = time.perf_counter()
    carved = carve(loaded, inputs)
    carve_s = time.perf_counter() - start
    random_bundle = random_unit_tests(loaded.graph)
    ops = {n.op for n in loaded.graph.nodes}
    rows = []
    for bug in BUGS:
        if bug == "none" or FAULTY_OP[bug] not in ops:
            continue
        row = fault_row(loaded, inputs, bug, carved, random_bundle)
        rows.append(row)
        print(f"  {name} {bug}: random {row.random_caught}, carved {row.carved_caught}, "
              f"migrate -> {row.migrate_named} ({row.model_runs} model runs, {row.seconds:.2f} s)", flush=True)
    start = time.perf_counter()
    clean = migrate(loaded, inputs, carved, get_backend("reference"), FaultyBackend("none"))
    clean_s = time.perf_counter() - start
    print(f"  {name} clean migration: {len(clean.moved)} op types moved, passed={clean.passed}, "
          f"{clean.model_runs} model runs, {clean_s:.1f} s", flush=True)
    return {"model": name, "nodes": len(loaded.graph.nodes), "input_sets": len(inputs), "carve_s": carve_s,
            "carved_cases": len(carved), "random_cases": len(random_bundle), "rows": [r.to_json() for r in rows],
            "clean_migration": clean.to_json(),
            "clean_migration_markdown": clean.to_markdown()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--proof-only", action="store_true")
    ap.add_argument("--inputs", type=int, default=2, help="realistic input sets per model")
    ap.add_argument("--render", action="store_true", help="only reprint the tables of the saved results")
    args = ap.parse_args()
    out = Path(__file__).parent / "results" / "fault_injection.json"
    if args.render:
        print_tables(json.loads(out.read_text()))
        return
    results = {"machine": platform.platform(), "python": platform.python_version(), "models": []}
    print("proof model", flush=True)
    results["models"].append(run_model_rows("proof", proof_loaded(), realistic_inputs(args.inputs)))
    if not args.proof_only:
        from edgerun.devtools.zoo_inputs import export_zoo, zoo_input_sets

        with tempfile.TemporaryDirectory() as tmp:
            for name in ("llama_small", "minilm_l6"):
                print(name, flush=True)
                export_zoo(name, Path(tmp) / f"{name}.erp")
                loaded = load_graph(Path(tmp) / f"{name}.erp")
                loaded = LoadedGraph(loaded.graph, loaded.program, f"{name}.erp")
                results["models"].append(run_model_rows(name, loaded, zoo_input_sets(name, loaded.graph,
                                                                                      args.inputs)))
    out.write_text(json.dumps(results, indent=1))
    print_tables(results)
    print(f"\nwrote {out}")


def print_tables(results: dict) -> None:  # type: ignore[type-arg]
    for m in results["models"]:
        print(f"\n### {m['model']} ({m['nodes']} nodes, {m['input_sets']} realistic input sets, "
              f"{m['carved_cases']} carved cases, {m['random_cases']} random unit tests, carving "
              f"{m['carve_s']:.2f} s)\n")
        print(proof_table([FaultRow(**r) for r in m["rows"]], FAULTY_OP))
        clean = m["clean_migration"]
        print(f"\nBug-free target: {len(clean['moved'])} op types moved, passed={clean['passed']}, "
              f"{clean['model_runs']} model runs, worst model max abs error after any step "
              f"{max(s['model_error']['max_abs'] for s in clean['steps']):.3g}.")


if __name__ == "__main__":
    main()
