#!/usr/bin/env python
"""Server CPU per update: what one replica spends between a device's check-in that brings a new release and
that device's report of it (the check-in answer with its signed assignment, the blob download, the report).

For each `--server-tree` (this checkout by default; give two to compare, e.g. an older checkout first), in
turn on one fresh PostgreSQL: one server process, `--devices` devices enrolled by COPY, every device checks in
once (warm-up, up to date), then a release for every device is published and every device checks in once more
and installs it (`--rounds` releases). Server CPU is its process tree's; the table gives CPU ms per update and
per up-to-date check-in, with the load average.

    PYTHONPATH=$PWD .venv/bin/python bench/fleet_update_cost.py --devices 1000 --server-tree OLD --server-tree .
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from fleet_sim import Simulator, make_package, start_server, tree_cpu_s  # noqa: E402

from edgerun.fleet.admin_client import AdminClient  # noqa: E402
from edgerun.fleet.local_postgres import LocalPostgres  # noqa: E402
from edgerun.fleet.signing import KeyDir, Root  # noqa: E402


async def one_tree(tree: Path, pg: LocalPostgres, args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="fleet-update-cost-"))
    keys = KeyDir(base / "keys")
    keys.init()
    proc, url = start_server(base, keys, 1, pg.url, name="server", extra=tuple(args.server_arg), tree=tree.resolve())
    admin = AdminClient(url, "admin")
    sim = Simulator(url, Root(keys.root_chain()[-1]), args.devices, 32)
    sim.preload(pg.url)
    await sim.prime()
    rows = {"updates": [], "up_to_date": []}
    for r in range(args.rounds):
        admin.publish(make_package(base, 2 + 2 * r, "success"), keys, {"steps": [100]})
        await asyncio.sleep(0.5)
        sim.c.updates = 0
        cpu0 = tree_cpu_s(proc.pid)
        await sim.prime(args.concurrency)
        cpu = tree_cpu_s(proc.pid) - cpu0
        assert sim.c.updates == args.devices, (sim.c.updates, sim.c.last_error)
        rows["updates"].append(1000 * cpu / args.devices)
        await asyncio.sleep(1.0)  # the reports' group commit and the monitor settle
        cpu0 = tree_cpu_s(proc.pid)
        await sim.prime(args.concurrency)
        rows["up_to_date"].append(1000 * (tree_cpu_s(proc.pid) - cpu0) / args.devices)
    proc.terminate()
    proc.wait(60)
    return {"tree": str(tree), "cpu_ms_per_update": rows["updates"], "cpu_ms_per_up_to_date": rows["up_to_date"],
            "median_update_ms": statistics.median(rows["updates"]),
            "median_up_to_date_ms": statistics.median(rows["up_to_date"]), "errors": sim.c.errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server-tree", action="append", type=Path)
    ap.add_argument("--server-arg", action="append", default=[], help="passed to every `fleet serve`")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/fleet_update_cost.json")
    args = ap.parse_args()
    trees = args.server_tree or [REPO]
    loads = {"start": os.getloadavg()[0]}
    results = []
    for i, tree in enumerate(trees):
        pg = LocalPostgres().start()  # each tree on a fresh database
        try:
            results.append(asyncio.run(one_tree(tree, pg, args)))
        finally:
            pg.stop()
        loads[f"after_{i}"] = os.getloadavg()[0]
    print(f"{'tree':<40} {'CPU ms/update':>14} {'CPU ms/up-to-date':>18}  (per round)")
    for r in results:
        print(f"{r['tree']:<40} {r['median_update_ms']:>14.2f} {r['median_up_to_date_ms']:>18.2f}  "
              f"{[round(x, 2) for x in r['cpu_ms_per_update']]}")
    print("load average:", loads)
    args.out.write_text(json.dumps({
        "command": " ".join(["bench/fleet_update_cost.py", *sys.argv[1:]]), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_average": loads, "devices": args.devices, "rounds": args.rounds,
        "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
