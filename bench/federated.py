"""The issue's end-to-end federation, too long for CI: real agents on a loopback fleet server learning
scikit-learn's digits split non-IID (2-3 classes per device), held-out accuracy per round, and every
round's global weights against FedAvg computed directly in numpy from the same seeds and data.

    PYTHONPATH=$PWD .venv/bin/python bench/federated.py [--devices 8] [--rounds 10] [--epochs 2] [--lr 0.5]
        [--server-lr 2]
        [--out bench/results/federated.json]
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --compression    # int8 / top-k accuracy cost, in numpy
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --scale 1000     # streaming aggregation, MiniLM-sized
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --round-scale 1000   # one round of N devices, server
        # process over PostgreSQL, stream uploads, collector, close [--upload-threads 8]

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    before, load_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, os.getloadavg()[0]
    agg = StreamingFedAvg(1, reference, norm_bound=1e6)
    times, peaks = [], []
    for i in range(args.scale):
        t = time.perf_counter()
        agg.offer(f"d{i}", update, 100)
        times.append(time.perf_counter() - t)
        if (i + 1) in (10, args.scale // 10, args.scale // 2):  # flat: the peak after 10 updates is the last one's
            peaks.append({"updates": i + 1, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    t = time.perf_counter()
    agg.average()
    average_s = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times.sort()
    result = {"updates": args.scale, "parameters": params, "update_mib": params * 4 / 2**20,
              "median_ms_per_update": 1000 * times[len(times) // 2], "average_s": average_s,
              "peak_rss_mib": peak / 1024, "peak_rss_mib_after": [*peaks, {"updates": args.scale, "peak_rss_mib": peak / 1024}],
              "rss_before_aggregating_mib": before / 1024, "load_average_before": load_before,
              "load_average": os.getloadavg()[0]}
    print(json.dumps(result, indent=1))
    return result


def round_scale(args: argparse.Namespace) -> dict[str, object]:
    """One round of `--round-scale` simulated devices through the path a real round takes: a fleet server
    process on loopback over PostgreSQL, the devices enrolled straight into its database (fleet_sim's
    preload), each storing its packed update (the digits MLP's size) in its own collective storage under the
    record id `federated:<job>:<round>` and uploading it with the stream tunnel's Uploader to /v1/stream, then
    the collector (collector.py) reading the records and handing each to the job, then the close (stream the
    accepted updates from their files, aggregate, store the new version). CPU from /proc (the server's and
    PostgreSQL's process trees) and this process's clock (the collector); statements from pg_stat_statements."""
    import shutil
    import tempfile
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fleet_sim

    from edgerun.fleet import database
    from edgerun.fleet.federated.collector import collect, fetch_records
    from edgerun.fleet.federated.compression import pack_update
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, fleet_devices
    from edgerun.fleet.federated.training_task import encode_arrays, record_id
    from edgerun.fleet.local_postgres import LocalPostgres
    from edgerun.fleet.signing import KeyDir, Root
    from edgerun.stream.storage import CollectiveStore
    from edgerun.stream.uploader import Uploader

    n, name = args.round_scale, "scale"
    rng = np.random.default_rng(0)
    initial = {"0.weight": np.zeros((128, 64), np.float32), "0.bias": np.zeros(128, np.float32),
               "2.weight": np.zeros((10, 128), np.float32), "2.bias": np.zeros(10, np.float32)}
    base = Path(tempfile.mkdtemp(prefix="edgerun-fl-round-"))
    keys = KeyDir(base / "keys")
    keys.init()
    pg = LocalPostgres().start(fleet_sim.STAT_STATEMENTS)
    assert pg.proc is not None
    pg_pid = pg.proc.pid  # runuser, whose children are the postmaster and its backends
    try:
        server, url = fleet_sim.start_server(base, keys, 1, pg.url)
    except BaseException:
        pg.stop()
        raise

    def statement_calls() -> Counter[str]:
        """pg_stat_statements' calls since the last reset by first word (INSERT, SELECT, ...), its own aside."""
        calls: Counter[str] = Counter()
        with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres") as conn:
            for query, count in conn.execute("SELECT query, calls FROM pg_stat_statements "
                                             "WHERE query NOT ILIKE '%pg_stat_statements%'"):
                calls[query.lstrip().split(None, 1)[0].upper()] += int(count)
        return calls

    def phase(label: str, work: Callable[[], Any]) -> dict[str, Any]:
        """Runs `work()` and measures it: server, PostgreSQL and this process's CPU, statements, wall time."""
        fleet_sim.statements(pg, reset=True)
        cpu0, server0, db0, wall0 = time.process_time(), fleet_sim.tree_cpu_s(server.pid), \
            fleet_sim.tree_cpu_s(pg_pid), time.perf_counter()
        load_before = os.getloadavg()[0]
        value = work()
        wall = time.perf_counter() - wall0
        server_cpu, db_cpu = fleet_sim.tree_cpu_s(server.pid) - server0, fleet_sim.tree_cpu_s(pg_pid) - db0
        calls = statement_calls()
        writes = sum(calls[k] for k in ("INSERT", "UPDATE", "DELETE"))
        row = {"wall_s": wall, "bench_process_cpu_s": time.process_time() - cpu0, "server_cpu_s": server_cpu,
               "bench_process_cpu_ms_per_update": 1000 * (time.process_time() - cpu0) / n,
               "server_cpu_ms_per_update": 1000 * server_cpu / n, "postgres_cpu_ms_per_update": 1000 * db_cpu / n,
               "db_writes_per_update": writes / n, "db_statements_per_update": sum(calls.values()) / n,
               "statements": dict(calls), "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
        print(f"{label}: {json.dumps(row)}", flush=True)
        return {"value": value, **row}

    try:
        sim = fleet_sim.Simulator(url, Root(keys.root_chain()[-1]), n, 1)
        sim.preload(pg.url)
        engine = database.create_engine(pg.url)
        job = FederatedJob.start(engine, JobConfig(name, rounds=1, per_round=n, quorum=n, deadline_s=3600.0),
                                 initial, base / "updates")
        sampled = job.open_round(fleet_devices(engine, time.time() - 600), time.time())
        assert len(sampled) == n, f"sampled {len(sampled)} of {n} devices"

        # Each device's update in its collective storage, as the training run leaves it (outside the timing).
        deltas = {}
        for d in sim.devices:
            deltas[d.device_id] = {k: (0.01 * rng.standard_normal(a.shape)).astype(np.float32) for k, a in initial.items()}
            store = CollectiveStore(base / "devices" / d.device_id / "outputs.db", flush_threshold=1)
            store.put(name, {"job": name, "round": 1, "samples": 100,
                             "update": encode_arrays(pack_update(deltas[d.device_id]))}, record_id=record_id(name, 1))
            store.close()

        def upload(d: fleet_sim.SimDevice) -> int:
            store = CollectiveStore(base / "devices" / d.device_id / "outputs.db", flush_threshold=1)
            uploader = Uploader(store, url + "/v1/stream", d.device_id, token=d.token)
            try:
                return uploader.upload_all()
            finally:
                uploader.close()
                store.close()

        def upload_all() -> int:
            with ThreadPoolExecutor(args.upload_threads) as pool:
                return sum(pool.map(upload, sim.devices))

        uploads = phase("upload", upload_all)
        assert uploads["value"] == n, uploads["value"]
        collected = phase("collect", lambda: collect(job, fetch_records(url, "admin", name), time.time()))
        assert collected["value"] == Counter({"accepted": n}), collected["value"]
        closed = phase("close", lambda: job.close_round(evaluate=lambda w: 1.0))
        result = closed["value"]
        expected = {k: np.mean([deltas[d][k] for d in deltas], axis=0, dtype=np.float64) for k in initial}
        weights = job.global_weights()
        worst = max(float(np.max(np.abs(weights[k] - expected[k]))) for k in initial)
        assert result.participants == n and worst < 1e-6, (result.participants, worst)
    finally:
        server.terminate()
        server.wait(30)
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    update_bytes = len(encode_arrays(pack_update(deltas[sim.devices[0].device_id])))
    phases = {"upload": uploads, "collect": collected, "close": closed}
    out = {"devices": n, "db": "postgresql", "server_workers": 1, "upload_threads": args.upload_threads,
           "update_parameters": sum(a.size for a in initial.values()), "update_base64_bytes": update_bytes,
           "applied": result.participants, "max_abs_diff_vs_direct_fedavg": worst,
           "phases": {label: {k: v for k, v in row.items() if k not in ("value", "statements")}
                      for label, row in phases.items()},
           "statements_by_kind": {label: row["statements"] for label, row in phases.items()},
           "load_average": os.getloadavg()[0]}
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
    parser.add_argument("--upload-threads", type=int, default=8, help="devices uploading at once (--round-scale)")
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
