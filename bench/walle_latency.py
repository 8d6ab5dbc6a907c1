"""Trigger-to-result latency of a task run, cold (a fresh isolated `python -I` worker per run) against warm
(a pre-started isolated worker per task version, warm_pool.py), for Walle's three task classes, and how
many runs per second a device sustains with 1, 2 and 4 runs at once.

    light   a few lines (counts the events it is handed)
    middle  IPV feature extraction (edgerun.stream.ipv) over one item-page visit
    heavy   a model inference: the zoo's DIN as an edgerun program, loaded by the task

Both paths isolate alike (same level, uid, mount view, cgroup, seccomp); the figure is the wall time from
handing the inputs over to holding the result, in the agent's process.

    PYTHONPATH=$PWD .venv/bin/python bench/walle_latency.py [--runs 20] [--throughput-runs 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.fleet.container import Launch, Limits, run_in_container
from edgerun.fleet.sandbox import detect_level
from edgerun.fleet.warm_pool import WARM_WORKER, WarmPool
from edgerun.stream.ipv import generate_session

LIGHT = """\
def run(inputs):
    return {"events": len(inputs.get("events", []))}
"""
MIDDLE = """\
from edgerun.stream.events import Event
from edgerun.stream.ipv import ipv_feature

def run(inputs):
    return ipv_feature([Event.from_dict(e) for e in inputs["events"]])
"""
HEAVY = """\
import numpy as np
import edgerun

MODEL = edgerun.load("din.edgerun")  # module level: once per warm worker, once per run when cold

def run(inputs):
    args = [np.asarray(a, dtype=d) for a, d in zip(inputs["args"], inputs["dtypes"])]
    return {"score": np.asarray(MODEL(*args)).tolist()}
"""


def _tasks(root: Path) -> dict[str, tuple[Path, Any]]:
    import edgerun
    import edgerun.zoo

    rng = random.Random(7)
    session = generate_session(rng, 1_700_000_000_000, visits=1)
    visit = [e.to_dict() for e in session]
    start = next(i for i, e in enumerate(visit) if e["kind"] == "page_enter" and e["page_id"] == "item_detail")
    end = next(i for i, e in enumerate(visit) if i > start and e["kind"] == "page_exit")
    ipv_inputs = {"events": visit[start:end + 1]}
    zoo = edgerun.zoo.get("din")
    args = [np.asarray(a) for a in zoo.example_inputs()]
    out = {}
    for name, body, inputs in (("light", LIGHT, {"events": [1, 2, 3]}), ("middle", MIDDLE, ipv_inputs),
                               ("heavy", HEAVY, {"args": [a.tolist() for a in args],
                                                 "dtypes": [str(a.dtype) for a in args]})):
        d = root / name
        d.mkdir()
        (d / "main.py").write_text(body)
        if name == "heavy":
            edgerun.export(zoo.build(), zoo.example_inputs()).save(d / "din.edgerun")
        for sub in [d, *d.iterdir()]:
            os.chmod(sub, 0o755 if sub.is_dir() else 0o444)
        out[name] = (d, inputs)
    return out


def _runs_per_s(run_once: Any, concurrency: int, total: int) -> float:
    """`total` runs by `concurrency` threads; every run must succeed."""
    left = [total]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            r = run_once()
            assert r.ok, r.error

    t = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return round(total / (time.perf_counter() - t), 1)


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per task class and path")
    ap.add_argument("--throughput-runs", type=int, default=40, help="runs per concurrency level")
    args = ap.parse_args()
    limits = Limits(timeout_s=30, memory_mb=1024)
    level = detect_level()
    root = Path(tempfile.mkdtemp(prefix="walle-latency-"))
    root.chmod(0o755)
    tasks = _tasks(root)

    def launch_for(folder: Path, entry: str, lim: Limits) -> Launch:
        return Launch.prepare(folder, entry, lim, level=level, work_root=root / "scratch", worker_script=WARM_WORKER)

    pool = WarmPool(launch_for, max_concurrency=4, per_version=1)
    rows: list[dict[str, Any]] = []
    for name, (folder, inputs) in tasks.items():
        cold: list[float] = []
        for _ in range(args.runs):
            t = time.perf_counter()
            r = run_in_container(folder, "main.py", inputs, limits=limits, level=level, work_root=root / "scratch")
            cold.append((time.perf_counter() - t) * 1000)
            assert r.ok, r.error
        pool.prestart(folder, "main.py", limits, wait=True)
        warm: list[float] = []
        for _ in range(args.runs):
            t = time.perf_counter()
            r = pool.run(folder, "main.py", limits, inputs)
            warm.append((time.perf_counter() - t) * 1000)
            assert r.ok and r.extra.get("warm"), r.error
        rows.append({"task": name, "cold_ms": _median_ms(cold), "warm_ms": _median_ms(warm),
                     "speedup": round(statistics.median(cold) / statistics.median(warm), 1)})

    light, light_inputs = tasks["light"]
    throughput: list[dict[str, Any]] = []
    for concurrency in (1, 2, 4):
        pool_c = WarmPool(launch_for, max_concurrency=concurrency, per_version=concurrency)
        pool_c.prestart(light, "main.py", limits, wait=True)
        def cold_once() -> Any:
            return run_in_container(light, "main.py", light_inputs, limits=limits, level=level,
                                    work_root=root / "scratch")

        def warm_once(pool_c: WarmPool = pool_c) -> Any:
            return pool_c.run(light, "main.py", limits, light_inputs)

        for mode, once in (("cold", cold_once), ("warm", warm_once)):
            throughput.append({"concurrency": concurrency, "mode": mode,
                               "runs_per_s": _runs_per_s(once, concurrency, args.throughput_runs)})
        pool_c.close()
    pool.close()

    print(f"isolation {level}; load average {os.getloadavg()[0]:.1f}; {args.runs} runs per cell (medians)")
    print(f"{'task':<8} {'cold ms':>9} {'warm ms':>9} {'cold/warm':>10}")
    for row in rows:
        print(f"{row['task']:<8} {row['cold_ms']:>9} {row['warm_ms']:>9} {row['speedup']:>10}")
    print(f"\n{'concurrency':<12} {'mode':<5} {'runs/s':>7}   (light task, {args.throughput_runs} runs)")
    for row in throughput:
        print(f"{row['concurrency']:<12} {row['mode']:<5} {row['runs_per_s']:>7}")
    out = Path(__file__).with_name("results") / "walle_latency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"isolation": level, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
                               "machine": platform.machine(), "runs": args.runs, "latency": rows,
                               "throughput": throughput}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
