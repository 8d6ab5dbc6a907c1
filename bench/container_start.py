"""Cost of the isolating compute container: added time per task run against the old plain spawn.

Runs a trivial task (`def run(inputs): return inputs`) --runs times at each isolation level this machine
supports, and as the old container did it (a plain `python -I` worker with RLIMIT_AS, result in a file),
interleaved so load changes hit every row alike. Prints medians, p90, the added milliseconds and the
ratio to the plain spawn, with the load average, and writes bench/results/container_start.json.

    .venv/bin/python bench/container_start.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgerun.fleet.container import Limits, run_in_container  # noqa: E402
from edgerun.fleet.sandbox import ISOLATION_LEVELS, detect_level, level_rank  # noqa: E402

TASK = "def run(inputs):\n    return inputs\n"
# The worker of the old container, inline: the same interpreter start, runpy and result file.
OLD_WORKER = (
    "import json, runpy, sys\n"
    "inputs = json.loads(sys.stdin.read() or 'null')\n"
    "ns = runpy.run_path(sys.argv[1] + '/main.py', run_name='__edgerun_task__')\n"
    "open(sys.argv[2], 'w').write(json.dumps({'ok': True, 'output': ns['run'](inputs)}))\n"
)


def plain_spawn(task_dir: Path, scratch: Path) -> Callable[[], float]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    def once() -> float:
        start = time.perf_counter()
        out = scratch / "result.json"
        subprocess.run([sys.executable, "-I", "-c", OLD_WORKER, str(task_dir), str(out)], input=b'{"x": 1}',
                       capture_output=True, preexec_fn=limit, timeout=30, check=True)
        assert json.loads(out.read_text())["ok"]
        return (time.perf_counter() - start) * 1000

    return once


def level_run(task_dir: Path, scratch: Path, level: str) -> Callable[[], float]:
    def once() -> float:
        start = time.perf_counter()
        r = run_in_container(task_dir, "main.py", {"x": 1}, limits=Limits(), level=level, work_root=scratch)
        assert r.ok and r.extra["isolation"] == level, (r.outcome, r.error)
        return (time.perf_counter() - start) * 1000

    return once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "container_start.json"))
    args = ap.parse_args()
    best = detect_level()
    levels = [lv for lv in ISOLATION_LEVELS if level_rank(lv) <= level_rank(best)]
    with tempfile.TemporaryDirectory(prefix="edgerun-bench-") as tmp:
        task_dir, scratch = Path(tmp) / "task", Path(tmp) / "scratch"
        task_dir.mkdir()
        scratch.mkdir()
        os.chmod(tmp, 0o755)  # the rlimit levels run the task under its own uid, which must reach the folder
        (task_dir / "main.py").write_text(TASK)
        rows: dict[str, Callable[[], float]] = {"plain spawn (old container)": plain_spawn(task_dir, scratch)}
        rows.update({level: level_run(task_dir, scratch, level) for level in levels})
        for fn in rows.values():
            fn()  # warm the page cache and the cgroup and bwrap paths once
        load_before = os.getloadavg()[0]
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.runs):
            for name, fn in rows.items():
                samples[name].append(fn())
        load_after = os.getloadavg()[0]
    base = statistics.median(samples["plain spawn (old container)"])
    results = []
    print(f"{'container':<30} {'median ms':>10} {'p90 ms':>8} {'added ms':>9} {'ratio':>6}")
    for name, values in samples.items():
        med = statistics.median(values)
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        results.append({"container": name, "median_ms": round(med, 1), "p90_ms": round(p90, 1),
                        "added_ms": round(med - base, 1), "ratio": round(med / base, 2), "runs": len(values)})
        print(f"{name:<30} {med:>10.1f} {p90:>8.1f} {med - base:>9.1f} {med / base:>6.2f}")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after; {os.cpu_count()} cpus; "
          f"device level {best}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(),
                                          "load_average": [load_before, load_after], "level": best,
                                          "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
