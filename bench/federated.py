"""The issue's end-to-end federation, too long for CI: real agents on a loopback fleet server learning
scikit-learn's digits split non-IID (2-3 classes per device), held-out accuracy per round, and every
round's global weights against FedAvg computed directly in numpy from the same seeds and data.

    PYTHONPATH=$PWD .venv/bin/python bench/federated.py [--devices 8] [--rounds 10] [--epochs 2] [--lr 0.5]
        [--server-lr 2]
        [--out bench/results/federated.json]
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --compression    # int8 / top-k accuracy cost, in numpy
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --scale 1000     # the job's running sum, MiniLM-sized
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --large-round 16 # MiniLM-sized updates in parts through
        # a fleet server at the real 16 MiB cap, collected page by page in a process of its own [--page 4]
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
from process_memory import peak_rss_mb  # bench/ is this script's directory


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


def minilm_shapes() -> dict[str, tuple[int, ...]]:
    """Weights shaped like all-MiniLM-L6-v2's largest (22.5 M float32 parameters, 86 MiB an update)."""
    shapes: dict[str, tuple[int, ...]] = {"embeddings": (30522, 384), "position": (512, 384)}
    shapes.update({f"layer{i}.{w}": s for i in range(6) for w, s in
                   (("qkv", (384, 1152)), ("out", (384, 384)), ("up", (384, 1536)), ("down", (1536, 384)))})
    return shapes


def scale(args: argparse.Namespace) -> dict[str, object]:
    """Aggregation time per update and peak memory for `--scale` MiniLM-sized updates taken by the job as the
    collector hands them over (`FederatedJob.receive_many`, pages of 100): validation, the running float64
    sum, and the sum's checkpoint written once a page (running_sum.py), on a SQLite fleet database. One
    update is drawn once and offered under each device id, so the timing is the job's alone."""
    import shutil
    import tempfile

    from edgerun.fleet import database
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, Offer
    from edgerun.fleet.targeting import DeviceProfile

    n, page = args.scale, 100
    rng = np.random.default_rng(0)
    shapes = minilm_shapes()
    reference = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    update = {k: (0.01 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    params = sum(a.size for a in update.values())
    base = Path(tempfile.mkdtemp(prefix="edgerun-fl-scale-"))
    try:
        engine = database.create_engine(database.sqlite_url(base))
        database.upgrade(engine)
        job = FederatedJob.start(engine, JobConfig("scale", rounds=1, per_round=n, quorum=n, deadline_s=1e9,
                                                   norm_bound=1e6), reference, base / "updates")
        devices = job.open_round([DeviceProfile(f"d{i:05d}") for i in range(n)], now=0.0)
        before, load_before = peak_rss_mb(), os.getloadavg()[0]
        per_update: list[float] = []
        cpu_per_update: list[float] = []
        peaks: list[dict[str, object]] = []
        for lo in range(0, n, page):
            t, cpu = time.perf_counter(), time.process_time()
            verdicts = job.receive_many((Offer(d, 1, update, 100) for d in devices[lo:lo + page]), now=1.0)
            per_update.append((time.perf_counter() - t) / len(verdicts))
            cpu_per_update.append((time.process_time() - cpu) / len(verdicts))
            assert verdicts == ["accepted"] * len(verdicts), set(verdicts)
            if lo + page in (page, n // 2, n) or lo + page >= n:
                peaks.append({"updates": min(lo + page, n), "peak_rss_mib": peak_rss_mb()})
        t = time.perf_counter()
        result = job.close_round(evaluate=lambda w: 1.0)
        close_s = time.perf_counter() - t
        assert result.participants == n
        worst = max(float(np.max(np.abs(job.global_weights()[k] - update[k]))) for k in shapes)
        engine.dispose()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    per_update.sort()
    cpu_per_update.sort()
    out = {"updates": n, "parameters": params, "update_mib": params * 4 / 2**20, "page": page,
           "median_ms_per_update": 1000 * per_update[len(per_update) // 2],
           "median_cpu_ms_per_update": 1000 * cpu_per_update[len(cpu_per_update) // 2], "close_s": close_s,
           "max_abs_diff_vs_mean": worst, "peak_rss_mib": peak_rss_mb(),
           "peak_rss_mib_after": [*peaks, {"updates": "close", "peak_rss_mib": peak_rss_mb()}],
           "rss_before_aggregating_mib": before, "load_average_before": load_before,
           "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=1))
    return out


def collect_child(spec: dict[str, Any]) -> dict[str, Any]:
    """The collector of --large-round in a process of its own: its peak RSS is the collector's alone."""
    from edgerun.fleet import database
    from edgerun.fleet.federated.collector import StreamRecords, collect
    from edgerun.fleet.federated.rounds import FederatedJob

    engine = database.create_engine(spec["db"])
    job = FederatedJob(engine, spec["job"], spec["updates"])
    peaks: list[dict[str, object]] = [{"updates": 0, "peak_rss_mib": peak_rss_mb()}]
    cpu, wall = time.process_time(), time.perf_counter()
    verdicts = collect(job, StreamRecords(spec["url"], spec["admin"], spec["job"], page_records=spec["page"]), 1.0,
                       on_page=lambda v: peaks.append({"updates": sum(v.values()), "peak_rss_mib": peak_rss_mb()}))
    collect_cpu, collect_wall = time.process_time() - cpu, time.perf_counter() - wall
    t = time.perf_counter()
    result = job.close_round(evaluate=lambda w: 1.0)
    close_s = time.perf_counter() - t
    peaks.append({"updates": "close", "peak_rss_mib": peak_rss_mb()})
    weights = job.global_weights()
    engine.dispose()
    return {"verdicts": dict(verdicts), "participants": result.participants, "collect_wall_s": collect_wall,
            "collect_cpu_s": collect_cpu, "close_s": close_s, "peak_rss_mib_after": peaks,
            "weights_file": spec["weights_out"], "_weights": weights}


def large_round(args: argparse.Namespace) -> dict[str, object]:
    """A round of `--large-round` MiniLM-sized updates (86 MiB of float32, about 115 MiB of JSON each, past
    the tunnel's 16 MiB batch) through the real path at the real cap: a fleet server process on loopback
    (SQLite), each device enrolled as an agent, its update in its own collective storage under the round's
    record id, uploaded by the stream tunnel's Uploader in 8 MiB parts; then the collector in a process of
    its own reads the records in pages of `--page` and adds each update to the round's running sum as it
    reads it; its peak RSS after each page shows the memory does not grow with the count."""
    import shutil
    import subprocess
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fleet_sim

    from edgerun.fleet import database
    from edgerun.fleet.federated.compression import pack_update
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
    from edgerun.fleet.federated.training_task import encode_arrays, record_id
    from edgerun.fleet.local_server import start_server
    from edgerun.fleet.signing import KeyDir
    from edgerun.fleet.targeting import DeviceProfile
    from edgerun.stream.storage import CollectiveStore
    from edgerun.stream.uploader import Uploader

    n, name = args.large_round, "large"
    shapes = minilm_shapes()
    rng = np.random.default_rng(0)
    reference = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    update = {k: (0.01 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    base = Path(tempfile.mkdtemp(prefix="edgerun-fl-large-"))
    keys = KeyDir(base / "keys")
    keys.init()
    server = start_server(base / "server", keys)
    try:
        db_url = database.sqlite_url(server.data)
        engine = database.create_engine(db_url)
        FederatedJob.start(engine, JobConfig(name, rounds=1, per_round=n, quorum=n, deadline_s=1e9, norm_bound=1e6),
                           reference, base / "updates").open_round([DeviceProfile(f"phone-{i:03d}") for i in range(n)], 0.0)
        engine.dispose()
        upload_wall = upload_cpu = server_cpu = 0.0
        json_bytes = parts = 0
        for i in range(n):  # device i sends (i + 1) x the update: the mean is known exactly
            device = f"phone-{i:03d}"
            agent = server.agent(device, base / device)
            agent.step()
            store = CollectiveStore(base / device / "outputs.db", flush_threshold=1)
            store.put(name, {"job": name, "round": 1, "samples": 100,
                             "update": encode_arrays(pack_update({k: a * np.float32(i + 1) for k, a in update.items()}))},
                      record_id=record_id(name, 1))
            uploader = Uploader(store, server.url + "/v1/stream", device, agent.token, timeout_s=120.0)
            cpu0, server0, wall0 = time.process_time(), fleet_sim.tree_cpu_s(server.proc.pid), time.perf_counter()
            assert uploader.upload_all(timeout_s=600.0) == 1
            upload_wall += time.perf_counter() - wall0
            upload_cpu += time.process_time() - cpu0
            server_cpu += fleet_sim.tree_cpu_s(server.proc.pid) - server0
            json_bytes += int(uploader.bytes_sent)
            parts += uploader.parts_sent
            uploader.close()
            store.close()
            agent.close()
            shutil.rmtree(base / device, ignore_errors=True)
            print(f"device {i + 1}/{n} uploaded ({uploader.parts_sent} parts)", flush=True)
        load_after_upload = os.getloadavg()[0]
        spec = {"db": db_url, "job": name, "updates": str(base / "updates"), "url": server.url,
                "admin": server.admin_token, "page": args.page, "weights_out": str(base / "weights.npz")}
        child = subprocess.run([sys.executable, __file__, "--collect-child", json.dumps(spec)], capture_output=True,
                               text=True, env={**os.environ})
        assert child.returncode == 0, child.stderr[-3000:]
        collected = json.loads(child.stdout.strip().splitlines()[-1])
        with np.load(base / "weights.npz") as archive:
            mean = (n + 1) / 2
            worst = max(float(np.max(np.abs(archive[k] - update[k] * np.float32(mean)))) for k in shapes)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert collected["verdicts"] == {"accepted": n} and collected["participants"] == n, collected
    out = {"devices": n, "db": "sqlite", "parameters": sum(a.size for a in update.values()),
           "part_bytes": 8 * 1024 * 1024, "parts_sent": parts, "compressed_bytes_sent": json_bytes,
           "upload_wall_s_per_update": upload_wall / n, "device_cpu_s_per_update": upload_cpu / n,
           "server_cpu_s_per_update": server_cpu / n, "load_average_after_upload": load_after_upload,
           "max_abs_diff_vs_mean": worst, **{k: v for k, v in collected.items() if k != "weights_file"},
           "collect_cpu_s_per_update": collected["collect_cpu_s"] / n, "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=1))
    return out


def round_scale(args: argparse.Namespace) -> dict[str, object]:
    """One round of `--round-scale` simulated devices through the path a real round takes: a fleet server
    process on loopback over PostgreSQL, the devices enrolled straight into its database (fleet_sim's
    preload), each storing its packed update (the digits MLP's size) in its own collective storage under the
    record id `federated:<job>:<round>` and uploading it with the stream tunnel's Uploader to /v1/stream, then
    the collector (collector.py) reading the records a page at a time and handing each to the job, which adds
    it to the round's running sum, then the close (average, store the new version). CPU from /proc (the server's and
    PostgreSQL's process trees) and this process's clock (the collector); statements from pg_stat_statements."""
    import shutil
    import tempfile
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    import psycopg
    import sqlalchemy as sa

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fleet_sim

    from edgerun.fleet import database
    from edgerun.fleet.federated.collector import collect, fetch_records
    from edgerun.fleet.federated.compression import pack_update
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, fleet_devices
    from edgerun.fleet.federated.training_task import encode_arrays, record_id
    from edgerun.fleet.local_postgres import LocalPostgres
    from edgerun.fleet.signing import KeyDir, Root
    from edgerun.stream.cloud import stream_records
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
        with engine.connect() as conn:  # the collector removed every record it recorded
            left = conn.execute(sa.select(sa.func.count()).select_from(stream_records)
                                .where(stream_records.c.task_id == name)).scalar_one()
        assert left == 0, f"{left} records left in the stream store"
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
           "applied": result.participants, "max_abs_diff_vs_direct_fedavg": worst, "stream_records_left": left,
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
    parser.add_argument("--large-round", type=int, default=0,
                        help="one server round of this many MiniLM-sized updates, uploaded in parts")
    parser.add_argument("--page", type=int, default=4, help="records a collector page holds (--large-round)")
    parser.add_argument("--collect-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.collect_child:
        spec = json.loads(args.collect_child)
        child = collect_child(spec)
        np.savez(spec["weights_out"], **child.pop("_weights"))
        print(json.dumps(child))
        return
    result = (compression_cost(args) if args.compression else scale(args) if args.scale
              else round_scale(args) if args.round_scale else large_round(args) if args.large_round
              else full_run(args))
    kind = ("_compression" if args.compression else "_scale" if args.scale
            else "_round_scale" if args.round_scale else "_large_round" if args.large_round else "")
    out = Path(args.out or f"bench/results/federated{kind}.json")
    result = {"command": "bench/federated.py " + " ".join(sys.argv[1:]).replace(f"--out {args.out}", "").strip(),
              "machine": platform.platform(), "cpus": os.cpu_count(), **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
