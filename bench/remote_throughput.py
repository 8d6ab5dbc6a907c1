"""Remote runtime on loopback: round trip of a tiny call and bulk tensor transfer, against a local call.

The server runs in its own process (`edgerun serve`), as on a real device. Prints a table of medians and
writes bench/results/remote_throughput.json (remote_throughput_curve.json with --curve: the same over a
CURVE-encrypted connection, to show what encryption costs).

    .venv/bin/python bench/remote_throughput.py [--repeats 50] [--curve]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import edgerun
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program

RESULTS = Path(__file__).parent / "results" / "remote_throughput.json"


def _tiny_program() -> Program:
    g = Graph()
    x = g.add_input("x", TensorSpec((4,), "float32"))
    g.outputs = [Builder(g).emit("add", [x, x])]
    return Program(graph=g)


def _median_s(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--curve", action="store_true", help="CURVE keys instead of a token (encrypted)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    token = secrets.token_hex(24)
    (tmp / "token").write_text(token)
    auth = ["--token-file", str(tmp / "token")]
    keys: dict[str, Path] = {}
    if args.curve:
        from edgerun.remote.keys import init_keys

        keys["server"] = init_keys(tmp / "server", "server")[0]
        client_public, keys["client"] = init_keys(tmp / "clients", "bench")
        auth = ["--curve-secret", str(tmp / "server" / "server.key_secret"), "--curve-allow", str(client_public)]
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "serve", "--port", "0", *auth],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().split("listening on ")[1].split()[0]
    rows = []
    results = RESULTS.with_name("remote_throughput_curve.json") if args.curve else RESULTS
    try:
        if args.curve:
            remote = edgerun.connect(url, server_key=keys["server"], client_key=keys["client"])
        else:
            remote = edgerun.connect(url, token)
        program = _tiny_program()
        remote.upload(program, name="tiny")
        fn = remote.function("tiny")
        x = np.ones(4, np.float32)
        xt, out = remote.tensor(x), remote.empty((4,), "float32")
        local = edgerun.load(program)
        t_local = _median_s(lambda: local(x), args.repeats * 10)
        t_handles = _median_s(lambda: fn(xt, out=out), args.repeats * 4)
        t_inline = _median_s(lambda: fn(x, fetch=True), args.repeats * 4)
        rows.append(("tiny call, local edgerun.load", t_local * 1e3, None))
        rows.append(("tiny call, remote, device tensors (out=)", t_handles * 1e3, None))
        rows.append(("tiny call, remote, inline args + fetch", t_inline * 1e3, None))
        for mb in (1, 16, 64, 256):
            arr = np.random.default_rng(0).standard_normal(mb * (1 << 18)).astype(np.float32)
            reps = max(3, args.repeats // max(1, mb // 4))
            handles = []
            t_put = _median_s(lambda arr=arr, kept=handles: kept.append(remote.tensor(arr)), reps)
            t_get = _median_s(lambda h=handles[0]: h.numpy(), reps)
            remote.request("free", {"handles": [h.handle for h in handles]})
            rows.append((f"upload {mb} MB tensor", t_put * 1e3, mb * 1.048576 / t_put))
            rows.append((f"fetch {mb} MB tensor", t_get * 1e3, mb * 1.048576 / t_get))
        remote.close()
    finally:
        proc.terminate()
        proc.wait()
    print(f"{'what':45s} {'median ms':>10s} {'MB/s':>10s}")
    for what, ms, mbps in rows:
        print(f"{what:45s} {ms:10.3f} {'' if mbps is None else f'{mbps:10.0f}':>10s}")
    print(f"remote tiny call / local call: {rows[1][1] / rows[0][1]:.1f}x")
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps([{"what": w, "median_ms": ms, "mb_per_s": m} for w, ms, m in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
