"""IPV on the device (Walle §7.1): bytes uploaded per batch, raw events against IPV features, and
milliseconds per feature.

Both paths go through the real tunnel (DevicePipeline → SQLite → zstd batch → HTTP → the cloud end run by
this script on loopback): "raw" uploads every event of the item page visits, as the cloud-side paradigm
must; "ipv" runs the IPV task on the device and uploads one feature per visit.

    .venv/bin/python bench/stream_ipv.py [--visits 500] [--batch 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.ipv import IPV_TRIGGER, ITEM_PAGE, generate_session, ipv_feature
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch


def start_cloud(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "edgerun.stream.cloud_app", "--db",
                             f"sqlite:///{directory / 'cloud.db'}", "--port", str(port)])
    url = f"http://127.0.0.1:{port}/v1/stream"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/stats", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit("cloud end did not start")


def run_path(kind: str, events: list[Any], url: str, directory: Path, batch: int) -> dict[str, float]:
    pipeline = DevicePipeline(directory / kind, url, f"bench-{kind}", batch_records=batch, flush_threshold=batch)
    task_ms: list[float] = []

    def ipv_task(match: TriggerMatch) -> dict[str, Any]:
        start = time.perf_counter()
        feature = ipv_feature(match.events)
        task_ms.append((time.perf_counter() - start) * 1000)
        return feature

    if kind == "ipv":
        pipeline.register_task("ipv", [IPV_TRIGGER], ipv_task)
    else:
        # The cloud-side paradigm: every raw event on the item page goes up as it is.
        pipeline.register_task("raw", [[ITEM_PAGE]], lambda m: m.events[0].to_dict())
    EventEmitter(directory / kind, max_queued_events=10**7).emit_events(events)
    start, start_cpu = time.perf_counter(), time.process_time()
    while pipeline.pump(10_000):
        pass
    pump_s, pump_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    records = pipeline.store.pending_count()
    uploaded = pipeline.flush(timeout_s=120)
    assert pipeline.uploader is not None
    sent, batches = pipeline.uploader.bytes_sent, pipeline.store.counters()["upload_batches"]
    payload = sum(len(json.dumps(r.payload, separators=(",", ":"))) for r in pipeline.store.read(limit=10**7))
    pipeline.close()
    return {"records": records, "uploaded": uploaded, "batches": batches, "bytes_sent": sent,
            "json_bytes": payload, "pump_s": pump_s, "pump_cpu_s": pump_cpu_s, "task_ms_median": statistics.median(task_ms) if task_ms else 0.0,
            "task_ms_p90": statistics.quantiles(task_ms, n=10)[-1] if len(task_ms) > 10 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--visits", type=int, default=500)
    parser.add_argument("--batch", type=int, default=20, help="IPV features per upload batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--out", type=Path, default=Path("bench/results/stream_ipv.json"))
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stream-ipv-") as tmp:
        proc, url = start_cloud(Path(tmp))
        try:
            for repeat in range(args.repeats):
                events = generate_session(random.Random(args.seed + repeat), 1_700_000_000_000, args.visits)
                item_events = sum(1 for e in events if e.page_id == ITEM_PAGE)
                directory = Path(tmp) / f"r{repeat}"
                ipv = run_path("ipv", events, url, directory, args.batch)
                # Raw batches carry the same visits as one IPV batch: batch × events per visit records.
                raw = run_path("raw", events, url, directory, round(args.batch * item_events / args.visits))
                runs.append({"visits": args.visits, "item_page_events": item_events, "ipv": ipv, "raw": raw})
        finally:
            proc.terminate()
            proc.wait()

    def med(path: str, field: str, per: str | None = None) -> float:
        return statistics.median(r[path][field] / (r[path][per] if per else 1) for r in runs)

    raw_per_visit = statistics.median(r["raw"]["json_bytes"] / r["visits"] for r in runs)
    ipv_per_visit = statistics.median(r["ipv"]["json_bytes"] / r["visits"] for r in runs)
    raw_batch = med("raw", "bytes_sent", "batches")
    ipv_batch = med("ipv", "bytes_sent", "batches")
    events_per_visit = statistics.median(r["item_page_events"] / r["visits"] for r in runs)
    print(f"visits={args.visits} per repeat, {args.repeats} repeats, {events_per_visit:.1f} raw events per visit, "
          f"batch = {args.batch} visits")
    print(f"{'':<34}{'raw events':>14}{'IPV features':>14}{'reduction':>11}")
    print(f"{'JSON bytes per visit':<34}{raw_per_visit:>14,.0f}{ipv_per_visit:>14,.0f}"
          f"{1 - ipv_per_visit / raw_per_visit:>11.1%}")
    print(f"{'bytes uploaded per batch (zstd)':<34}{raw_batch:>14,.0f}{ipv_batch:>14,.0f}"
          f"{1 - ipv_batch / raw_batch:>11.1%}")
    print(f"{'bytes uploaded per visit (zstd)':<34}{med('raw', 'bytes_sent', 'records') * events_per_visit:>14,.0f}"
          f"{med('ipv', 'bytes_sent', 'records'):>14,.0f}")
    task_ms = statistics.median(r["ipv"]["task_ms_median"] for r in runs)
    pipeline_ms = statistics.median(r["ipv"]["pump_s"] * 1000 / r["visits"] for r in runs)
    pipeline_cpu_ms = statistics.median(r["ipv"]["pump_cpu_s"] * 1000 / r["visits"] for r in runs)
    print(f"ms per IPV feature: task {task_ms:.3f} (median; p90 "
          f"{statistics.median(r['ipv']['task_ms_p90'] for r in runs):.3f}); whole pipeline per visit "
          f"(queue read, trie, task, SQLite): {pipeline_cpu_ms:.3f} CPU, {pipeline_ms:.3f} wall")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "runs": runs, "raw_json_bytes_per_visit": raw_per_visit, "ipv_json_bytes_per_visit": ipv_per_visit,
        "raw_bytes_per_batch": raw_batch, "ipv_bytes_per_batch": ipv_batch, "task_ms_median": task_ms,
        "pipeline_ms_per_visit": pipeline_ms, "pipeline_cpu_ms_per_visit": pipeline_cpu_ms, "python": platform.python_version()}, indent=2))
    print(f"raw_bytes_per_batch={raw_batch:.0f} ipv_bytes_per_batch={ipv_batch:.0f} ms_per_feature={task_ms:.3f}")


if __name__ == "__main__":
    main()
