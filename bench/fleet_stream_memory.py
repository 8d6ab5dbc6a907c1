"""Memory and CPU of the push fan-out: what one open device stream (`GET /v1/devices/{id}/events`) costs a server process.

Registers --devices simulated devices, then opens their push streams in steps (--steps, e.g. 0 1000 2000 4000
streams), and after each step reads the server process's resident memory (/proc/PID/status VmRSS) once the
server's own gauge (`edgerun_fleet_open_streams`) counts them all. The per-stream cost is the slope of a
least-squares line through those points (so the server's fixed memory, and what registering cost, are out of it).
With `--cpu-window S`, after each step the server's CPU over S idle seconds too (the streams' heartbeats: a
ping each every 15 s), and its slope per 1,000 streams. With `--server-tree DIR` (repeatable) the server runs
from each checkout in turn, to compare code before and after a change in one run.
Each stream is a real TCP connection held open by this client with the server's `hello` read, as an agent holds it.

    PYTHONPATH=$PWD .venv/bin/python bench/fleet_stream_memory.py --devices 4000 --steps 0 1000 2000 4000
Prints a table and writes bench/results/fleet_stream_memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402
from fleet_sim import Simulator, start_server, tree_cpu_s  # noqa: E402

from edgerun.fleet.signing import KeyDir, Root  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_streams(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=60).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("edgerun_fleet_open_streams ")))


async def hold_stream(host: str, port: int, device_id: str, token: str, opened: asyncio.Event,
                      held: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /v1/devices/{device_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    while await reader.readline() not in (b"\r\n", b""):
        pass
    await reader.readline()  # the chunk carrying `hello`
    held.append(writer)
    opened.set()
    while await reader.read(4096):  # pings every 15 s; held until the end
        pass


def slope(xs: list[int], ys: list[int]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


async def measure(args: argparse.Namespace, tree: Path = REPO) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="fleet-streams-"))
    keys = KeyDir(base / "keys")
    keys.init()
    load_at_start = os.getloadavg()[0]
    proc, url = start_server(base, keys, 1, "", tree=tree)
    host, port = url.split("//", 1)[1].split(":")
    tasks: list[asyncio.Task[None]] = []
    held: list[asyncio.StreamWriter] = []
    try:
        sim = Simulator(url, Root(keys.root_chain()[-1]), args.devices, 64)
        await sim.register_all("enroll")
        points: list[tuple[int, int]] = []
        cpu_ms_per_s: list[float] = []
        for target in args.steps:
            while len(tasks) < target:
                d = sim.devices[len(tasks)]
                tasks.append(asyncio.create_task(hold_stream(host, int(port), d.device_id, d.token, asyncio.Event(), held)))
                if len(tasks) % 200 == 0:
                    await asyncio.sleep(0.2)  # let the server accept them in batches
            deadline = time.monotonic() + 300
            while await asyncio.to_thread(open_streams, url) < target:  # the streams' own reads go on meanwhile
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {open_streams(url)} of {target} streams open")
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            points.append((target, rss_kib(proc.pid)))
            if args.cpu_window:
                cpu0 = tree_cpu_s(proc.pid)
                await asyncio.sleep(args.cpu_window)
                cpu_ms_per_s.append(1000 * (tree_cpu_s(proc.pid) - cpu0) / args.cpu_window)
            print(f"{target} streams: server RSS {points[-1][1] / 1024:.1f} MiB"
                  + (f", idle CPU {cpu_ms_per_s[-1]:.0f} ms/s" if args.cpu_window else ""), file=sys.stderr, flush=True)
        per_stream = slope([p[0] for p in points], [p[1] for p in points])
        xs = [p[0] for p in points]
        return {"server_tree": str(tree), "load_average_start": load_at_start, "devices": args.devices,
                "points": [{"streams": s, "rss_kib": r, "idle_cpu_ms_per_s": cpu_ms_per_s[i] if cpu_ms_per_s else None}
                           for i, (s, r) in enumerate(points)],
                "kib_per_stream": per_stream,
                "idle_cpu_ms_per_s_per_1000_streams": 1000 * slope(xs, cpu_ms_per_s) if cpu_ms_per_s else None,
                "load_average": os.getloadavg()[0]}
    finally:
        for t in tasks:
            t.cancel()
        for w in held:
            w.close()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4000)
    p.add_argument("--steps", type=int, nargs="+", default=[0, 1000, 2000, 4000])
    p.add_argument("--cpu-window", type=float, default=0.0, help="seconds of idle server CPU measured per step")
    p.add_argument("--server-tree", action="append", type=Path,
                   help="a checkout whose edgerun serves (repeatable: each in turn; default: this one)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "fleet_stream_memory.json"))
    args = p.parse_args()
    if max(args.steps) > args.devices:
        raise SystemExit("--steps above --devices")
    results = [asyncio.run(measure(args, tree.resolve())) for tree in args.server_tree or [REPO]]
    for result in results:
        print(f"server from {result['server_tree']}")
        print("streams | server RSS MiB | idle CPU ms/s")
        for point in result["points"]:  # type: ignore[attr-defined]
            cpu = point["idle_cpu_ms_per_s"]
            print(f"{point['streams']} | {point['rss_kib'] / 1024:.1f} | {'-' if cpu is None else f'{cpu:.0f}'}")
        print(f"per open stream: {result['kib_per_stream']:.1f} KiB (least-squares slope)"
              + (f"; idle CPU per 1,000 streams: {result['idle_cpu_ms_per_s_per_1000_streams']:.1f} ms/s"
                 if result["idle_cpu_ms_per_s_per_1000_streams"] is not None else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": f"{os.cpu_count()} CPUs (shared)",
                               "load_average": [r["load_average"] for r in results], "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
