"""The long fuzzing run: each parser of untrusted bytes (fuzz/targets.py) under atheris for a number of
executions (default 1,000,000 each), every target in its own process, one after another.

    PYTHONPATH=$PWD .venv/bin/python bench/fuzz_long.py [--runs 1000000] [--targets remote_wire gguf]

Prints a table of executions, seconds, executions per second, coverage and findings per target, with the
load average, and writes bench/results/fuzz_long.json. A finding leaves its input in the work folder
(printed); copy it to fuzz/regressions/TARGET/, fix the parser, and CI replays it from then on. The
corpus grown by the run stays in the work folder; `-merge=1` into fuzz/corpus/TARGET keeps what adds
coverage.

The results file keeps one row per target: a run of some targets replaces their rows and keeps the others,
each row with the command and the load average of the run that wrote it (on a shared machine, run the
slow targets one at a time under `nice -n 19`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuzz.targets import TARGETS  # noqa: E402 - after the repository is on the path


def run_target(target: str, runs: int, work: Path, limit_s: float) -> dict[str, object]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "fuzz.run", target, "--work", str(work), f"-runs={runs}",
                        f"-max_total_time={int(limit_s)}", "-print_final_stats=1", "-timeout=30"],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - start
    done = re.search(r"Done (\d+) runs in (\d+) second", r.stderr)
    executed = re.search(r"stat::number_of_executed_units:\s*(\d+)", r.stderr)
    cov = re.findall(r"cov: (\d+)", r.stderr)
    findings = sorted(p.name for p in work.glob("crash-*")) + sorted(p.name for p in work.glob("timeout-*"))
    return {"target": target, "executions": int(executed.group(1)) if executed else (int(done.group(1)) if done else 0),
            "fuzz_seconds": int(done.group(2)) if done else None, "wall_seconds": round(wall, 1),
            "coverage": int(cov[-1]) if cov else None, "findings": findings, "returncode": r.returncode,
            "work": str(work)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--limit-s", type=float, default=4 * 3600, help="stop a target after this long")
    parser.add_argument("--targets", nargs="*", default=sorted(TARGETS), choices=sorted(TARGETS))
    args = parser.parse_args()
    rows = []
    for target in args.targets:
        work = Path(tempfile.mkdtemp(prefix=f"edgerun-fuzz-long-{target}-"))
        row = run_target(target, args.runs, work, args.limit_s)
        row["load_average"] = [round(x, 2) for x in os.getloadavg()]  # as the target ends
        rows.append(row)
        print(json.dumps(row), flush=True)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| target | executions | seconds | exec/s | coverage | findings |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        secs = row["fuzz_seconds"] or row["wall_seconds"]
        rate = round(int(row["executions"]) / float(secs)) if secs else "—"  # type: ignore[arg-type]
        print(f"| {row['target']} | {row['executions']:,} | {secs} | {rate} | {row['coverage']} | "
              f"{len(row['findings'])} |")  # type: ignore[arg-type]
    out = REPO / "bench" / "results" / "fuzz_long.json"
    command = f"bench/fuzz_long.py --runs {args.runs} --limit-s {args.limit_s:g} --targets {' '.join(args.targets)}"
    kept = {str(row["target"]): {**{k: v for k, v in row.items() if k != "work"},  # type: ignore[arg-type]
                                 "findings": len(row["findings"]), "command": command}  # type: ignore[arg-type]
            for row in rows}
    earlier = json.loads(out.read_text())["rows"] if out.exists() else []
    merged = {str(row["target"]): row for row in earlier} | kept
    out.write_text(json.dumps({"command": command, "machine": platform.machine(), "load_average": load,
                               "runs": args.runs, "rows": [merged[t] for t in sorted(merged)]}, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
