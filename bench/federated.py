"""The issue's end-to-end federation, too long for CI: real agents on a loopback fleet server learning
scikit-learn's digits split non-IID (2-3 classes per device), held-out accuracy per round, and every
round's global weights against FedAvg computed directly in numpy from the same seeds and data.

    PYTHONPATH=$PWD .venv/bin/python bench/federated.py [--devices 8] [--rounds 10] [--epochs 2] [--lr 0.5]
        [--server-lr 2]
        [--out bench/results/federated.json]
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --compression    # int8 / top-k accuracy cost, in numpy
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --scale 1000     # streaming aggregation, MiniLM-sized
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --round-scale 1000   # one server round of N devices

--compression runs the same federation without the fleet (local training and FedAvg in this process), once
per update compression, and prints the final held-out accuracy of each against the uncompressed run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def full_run(args: argparse.Namespace) -> dict[str, object]:
    from edgerun.fleet.federated.demo import run_federated
    from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg

    start, cpu = time.time(), time.process_time()
    run = run_federated(args.devices, args.rounds, epochs=args.epochs, lr=args.lr, server_lr=args.server_lr,
                        seed=args.seed)
    wall = time.time() - start
    shards, _ = digits_split(args.devices, args.seed)
    model, _, initial = digits_model(args.seed, args.lr)
    published = [r.outcome == "published" for r in run.results]
    reference = (direct_fedavg(model, initial, shards, run.sampled, args.seed, args.epochs, server_lr=args.server_lr)
                 if all(published) else [])
    worst = max((float(np.max(np.abs(run.weights[i][n] - w[n]))) for i, w in enumerate(reference) for n in w),
                default=float("nan"))
    accuracies = [r.metric for r in run.results]
    print(f"held-out accuracy per round: {[round(a, 3) if a is not None else None for a in accuracies]}")
    print(f"largest |fleet - direct numpy FedAvg| over all rounds and weights: {worst:.3g}")
    print(f"wall {wall:.0f} s (this process's CPU {time.process_time() - cpu:.0f} s), load {os.getloadavg()[0]:.1f}")
    return {"devices": args.devices, "rounds": args.rounds, "epochs": args.epochs, "lr": args.lr,
            "accuracy": accuracies, "outcomes": [r.outcome for r in run.results], "max_abs_diff": worst,
            "wall_s": wall, "load_average": os.getloadavg()[0]}


def compression_cost(args: argparse.Namespace) -> dict[str, object]:
    from edgerun.fleet.federated.compression import pack_update, unpack_update
    from edgerun.fleet.federated.digits_data import accuracy, digits_model, digits_split
    from edgerun.fleet.federated.fedavg import fedavg
    from edgerun.fleet.federated.local import local_update

    shards, (hx, hy) = digits_split(args.devices, args.seed)
    results: dict[str, object] = {}
    for scheme, fraction in (("none", 1.0), ("int8", 1.0), ("topk", 0.1)):
        model, _, weights = digits_model(args.seed, args.lr)
        curve, sent = [], 0
        for r in range(1, args.rounds + 1):
            updates = []
            for i, (images, labels) in enumerate(shards):
                delta, n = local_update(model, weights, images, labels, epochs=args.epochs, seed=(args.seed, r))
                packed = pack_update(delta, scheme, fraction)
                sent += sum(a.nbytes for a in packed.values())
                updates.append((str(i), unpack_update(packed, weights), n))
            weights = fedavg(weights, updates, r, server_lr=args.server_lr)
            curve.append(accuracy(model, weights, hx, hy))
        results[scheme] = {"accuracy": curve, "bytes_sent": sent}
        print(f"{scheme:>5}: final held-out accuracy {curve[-1]:.3f}, bytes uploaded {sent:,}")
    return {"load_average": os.getloadavg()[0], "schemes": results}


def scale(args: argparse.Namespace) -> dict[str, object]:
    """Aggregation time per update and peak memory for `--scale` updates shaped like all-MiniLM-L6-v2's
    weights (22.7 M float32 parameters, 87 MiB an update): one update is drawn once and offered under
    each device id, so the timing is the aggregation's alone (validation, then the running float64 sum)."""
    import resource

    from edgerun.fleet.federated.fedavg import StreamingFedAvg

    shapes = {"embeddings": (30522, 384), "position": (512, 384)}
    shapes.update({f"layer{i}.{w}": s for i in range(6) for w, s in
                   (("qkv", (384, 1152)), ("out", (384, 384)), ("up", (384, 1536)), ("down", (1536, 384)))})
    rng = np.random.default_rng(0)
    reference = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    update = {n: (0.01 * rng.standard_normal(s)).astype(np.float32) for n, s in shapes.items()}
    params = sum(a.size for a in update.values())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    agg = StreamingFedAvg(1, reference, norm_bound=1e6)
    times = []
    for i in range(args.scale):
        t = time.perf_counter()
        agg.offer(f"d{i}", update, 100)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    agg.average()
    average_s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times.sort()
    result = {"updates": args.scale, "parameters": params, "update_mib": params * 4 / 2**20,
              "median_ms_per_update": 1000 * times[len(times) // 2], "average_s": average_s,
              "peak_rss_mib": peak / 1024, "rss_before_aggregating_mib": before / 1024, "load_average": os.getloadavg()[0]}
    print(json.dumps(result, indent=1))
    return result


def round_scale(args: argparse.Namespace) -> dict[str, object]:
    """One server round of `--round-scale` simulated devices over a SQLite fleet database: each sends an
    update of the digits MLP's size; server CPU per update (receive: unpack, validate, store) and database
    statements per update, counted by SQLAlchemy's cursor events, then the close (aggregate, publish)."""
    import tempfile

    import sqlalchemy as sa

    from edgerun.fleet import database
    from edgerun.fleet.federated.compression import pack_update
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
    from edgerun.fleet.targeting import DeviceProfile

    n = args.round_scale
    rng = np.random.default_rng(0)
    initial = {"0.weight": np.zeros((128, 64), np.float32), "0.bias": np.zeros(128, np.float32),
               "2.weight": np.zeros((10, 128), np.float32), "2.bias": np.zeros(10, np.float32)}
    work = Path(tempfile.mkdtemp(prefix="edgerun-fl-scale-"))
    engine = database.create_engine(database.sqlite_url(work))
    database.upgrade(engine)
    job = FederatedJob.start(engine, JobConfig("scale", rounds=1, per_round=n, quorum=n, deadline_s=3600.0),
                             initial, work / "updates")
    devices = [DeviceProfile(f"sim-{i}") for i in range(n)]
    sampled = job.open_round(devices, 0.0)
    updates = [pack_update({k: (0.01 * rng.standard_normal(a.shape)).astype(np.float32)
                            for k, a in initial.items()}) for _ in range(8)]
    writes = {"n": 0, "all": 0}

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        writes["all"] += 1
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            writes["n"] += 1

    sa.event.listen(engine, "before_cursor_execute", count)
    cpu, wall = time.process_time(), time.perf_counter()
    for i, device in enumerate(sampled):
        job.receive(device, 1, updates[i % 8], 100, 1.0)
    receive_cpu, receive_wall = time.process_time() - cpu, time.perf_counter() - wall
    cpu, wall = time.process_time(), time.perf_counter()
    result = job.close_round(evaluate=lambda w: 1.0)
    close_cpu, close_wall = time.process_time() - cpu, time.perf_counter() - wall
    out = {"devices": n, "applied": result.participants, "receive_cpu_ms_per_update": 1000 * receive_cpu / n,
           "receive_wall_ms_per_update": 1000 * receive_wall / n,
           "db_writes_per_update": writes["n"] / n, "db_statements_per_update": writes["all"] / n,
           "close_cpu_s": close_cpu, "close_wall_s": close_wall, "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--server-lr", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compression", action="store_true")
    parser.add_argument("--scale", type=int, default=0, help="aggregate this many MiniLM-sized updates")
    parser.add_argument("--round-scale", type=int, default=0, help="one server round of this many devices")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = (compression_cost(args) if args.compression else scale(args) if args.scale
              else round_scale(args) if args.round_scale else full_run(args))
    kind = ("_compression" if args.compression else "_scale" if args.scale
            else "_round_scale" if args.round_scale else "")
    out = Path(args.out or f"bench/results/federated{kind}.json")
    result = {"command": "bench/federated.py " + " ".join(sys.argv[1:]).replace(f"--out {args.out}", "").strip(),
              "machine": platform.platform(), "cpus": os.cpu_count(), **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
