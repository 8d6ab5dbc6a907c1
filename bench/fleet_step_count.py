"""The step population's cost against the fleet's size: Python CPU and database time of one recount.

Fills a throwaway PostgreSQL (Debian's packages) with N devices (ids, stored buckets, last-seen times; a
tenth outside the liveness window), then times `releases.step_population` for a uniform release at each gray
step: the Python CPU it spends (time.process_time, this process only) and the wall time (the database's count
over the index ix_devices_bucket_seen). Prints a table, the query plan, and writes
bench/results/fleet_step_count.json.

    PYTHONPATH=$PWD .venv/bin/python bench/fleet_step_count.py --devices 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

from edgerun.fleet import releases as rel  # noqa: E402
from edgerun.fleet import rollout  # noqa: E402
from edgerun.fleet.database import create_engine, upgrade  # noqa: E402
from edgerun.fleet.local_postgres import LocalPostgres  # noqa: E402
from edgerun.fleet.schema import devices  # noqa: E402
from edgerun.fleet.targeting import device_bucket, release_offset, step_ranges  # noqa: E402

STEPS = (1.0, 5.0, 20.0, 50.0, 100.0)


def fill(engine: sa.Engine, start: int, stop: int) -> None:
    now = time.time()
    for lo in range(start, stop, 20_000):
        rows = []
        for i in range(lo, min(stop, lo + 20_000)):
            d = f"dev-{i:08d}"
            rows.append({"id": d, "token_hash": hashlib.sha256(d.encode()).hexdigest(),
                         "profile": {"device_id": d}, "device_groups": [], "bucket": device_bucket(d),
                         "registered_at": now, "last_seen": now - (7200 if i % 10 == 0 else 0)})
        with engine.begin() as conn:
            conn.execute(devices.insert(), rows)
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE devices"))


def measure(engine: sa.Engine, repeats: int) -> tuple[float, float]:
    """Median Python CPU ms and wall ms of one recount (every step of a uniform release, averaged per step)."""
    policy = rollout.RolloutPolicy(steps=STEPS, active_window_s=3600)
    cpu, wall = [], []
    with engine.connect() as conn:
        for _ in range(repeats):
            for step in range(len(STEPS)):
                state = rollout.RolloutState(stage="gray", step=step)
                c0, w0 = time.process_time(), time.perf_counter()
                rel.step_population(conn, "bench", 2, {"kind": "uniform"}, policy, state)
                cpu.append(1000 * (time.process_time() - c0))
                wall.append(1000 * (time.perf_counter() - w0))
    return statistics.median(cpu), statistics.median(wall)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "fleet_step_count.json"))
    args = p.parse_args()
    rows = []
    with LocalPostgres() as pg:
        engine = create_engine(pg.url)
        upgrade(engine)
        have = 0
        for n in sorted(args.devices):
            fill(engine, have, n)
            have = n
            cpu_ms, wall_ms = measure(engine, args.repeats)
            rows.append({"devices": n, "python_cpu_ms": cpu_ms, "wall_ms": wall_ms, "load_average": os.getloadavg()[0]})
            print(f"{n} devices: {cpu_ms:.2f} ms Python CPU, {wall_ms:.2f} ms wall per recount", file=sys.stderr)
        lo, hi = step_ranges(release_offset("bench", 2), 5.0)[0]
        with engine.connect() as conn:
            plan = [r[0] for r in conn.execute(sa.text(
                "EXPLAIN SELECT count(*) FROM devices WHERE last_seen >= :s AND bucket >= :lo AND bucket < :hi"),
                {"s": time.time() - 3600, "lo": lo, "hi": hi})]
        engine.dispose()
    print("devices | Python CPU ms per recount | wall ms per recount | load average")
    for r in rows:
        print(f"{r['devices']} | {r['python_cpu_ms']:.2f} | {r['wall_ms']:.2f} | {r['load_average']:.1f}")
    print("plan of the 5% step's count:\n  " + "\n  ".join(plan))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(),
                               "load_average": [r["load_average"] for r in rows], "results": rows,
                               "plan_5_percent": plan}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
