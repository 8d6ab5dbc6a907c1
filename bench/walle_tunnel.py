"""Real-time tunnel latency (Walle §4.3: over 90% of uploads of 3 KB or less arrive in under 250 ms).

One upload = a task output becomes ready on the device → written to collective storage (SQLite, fsync) →
sent at once as a zstd batch over the uploader's keep-alive connection → the cloud end (run by this script
on loopback, its own process, SQLite) stored it and answered 200 → marked uploaded on the device. Payloads
are JSON features of random size up to 3 KB and up to 30 KB (random text, so compression does not hide
the size). Loopback has no WAN delay: the figure is what the device and the cloud end add; Walle's is over
a mobile network.

    PYTHONPATH=$PWD .venv/bin/python bench/walle_tunnel.py [--uploads 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Uploader

WALLE = {"<=3KB": "over 90% under 250 ms (Walle §7, mobile network)"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cloud(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edgerun.stream.cloud_app", "--db",
                             f"sqlite:///{directory / 'cloud.db'}", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1/stream"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url.rsplit("/v1", 1)[0] + "/docs", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the cloud end did not start")


def _payload(rng: random.Random, max_bytes: int) -> dict[str, Any]:
    size = rng.randint(max_bytes // 10, max_bytes - 100)
    return {"feature": "".join(rng.choices(string.ascii_letters + string.digits, k=size))}


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return {"p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
            "under_250ms": round(sum(s < 250 for s in ordered) / len(ordered), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--uploads", type=int, default=200, help="uploads per payload class")
    args = ap.parse_args()
    rng = random.Random(18)
    root = Path(tempfile.mkdtemp(prefix="walle-tunnel-"))
    proc, url = _cloud(root)
    rows: list[dict[str, Any]] = []
    try:
        for label, limit in (("<=3KB", 3 * 1024), ("<=30KB", 30 * 1024)):
            store = CollectiveStore(root / f"outputs-{limit}.db", flush_threshold=1)
            uploader = Uploader(store, url, f"dev-{limit}")
            uploader.upload_ready()  # opens the keep-alive connection, as a running device has
            samples: list[float] = []
            for _ in range(args.uploads):
                payload = _payload(rng, limit)
                start = time.perf_counter()
                store.put("ipv", payload)
                store.flush()
                sent = uploader.upload_ready()
                samples.append((time.perf_counter() - start) * 1000)
                assert sent == 1, "an upload failed"
            rows.append({"payloads": label, "uploads": args.uploads, **_percentiles(samples),
                         "walle": WALLE.get(label, "")})
            uploader.close()
            store.close()
    finally:
        proc.terminate()
        proc.wait(10)
    load = os.getloadavg()[0]
    print(f"tunnel latency on loopback, load average {load:.1f}; {args.uploads} uploads per class")
    print(f"{'payloads':<8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'<250ms':>7}   Walle")
    for r in rows:
        print(f"{r['payloads']:<8} {r['p50_ms']:>7} {r['p90_ms']:>7} {r['p99_ms']:>7} {r['under_250ms']:>7}   "
              f"{r['walle']}")
    out = Path(__file__).with_name("results") / "walle_tunnel.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
