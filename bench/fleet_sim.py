"""Fleet simulator: thousands of simulated agents as async clients of a real release server on loopback.

Measures, on SQLite and optionally on PostgreSQL (a throwaway cluster from Debian's packages):
  1. the fleet's own load: every device checks in on its own schedule (every --checkin-interval seconds,
     jittered, from a random start), so the offered load is devices / interval, what that fleet would send;
     reported: check-ins answered per second, per server CPU-second (the server's whole process tree), and
     on PostgreSQL the database statements per check-in (pg_stat_statements, every statement the server ran
     in the window: check-ins, last-seen flushes, monitor ticks);
  2. time for a gray release (1% → 5% → 20% → 50% → 100%) to reach every simulated device;
  3. time from a bad version's first failure reports to the rollback version running on every device;
  with --first-step instead (issue #18): the time for a release's first gray step to reach every device it
  targets, devices polling every --poll-interval seconds (60) alone, against the same devices also holding
  the server's push stream open (push-then-pull);
  with --matrix instead: one configuration of the measurement matrix, every figure from one run, through
  nginx whatever the replica count (`run_matrix`; writes bench/results/fleet_sim_matrix_<N>k_<R>r.json).

Each simulated device is a coroutine with its own token and installed versions. It verifies the
assignment and release signatures (ed25519) and each pulled file's SHA-256 and length, just as the real
agent does, but "runs" the task by reading `sim_outcome` from the task config instead of spawning a
worker process, so that thousands fit on two cores. Devices share a pool of keep-alive connections, as the
upstream connections of a load balancer in front of the servers are shared (each device still has its own
id, token and schedule, so the pool never decides which device speaks).

    .venv/bin/python bench/fleet_sim.py --devices 10000 --db sqlite --db postgres
    .venv/bin/python bench/fleet_sim.py --matrix --devices 100000 --replicas 3 --checkin-interval 300
Prints a table and writes bench/results/fleet_sim.json. With `--server-tree DIR` (repeatable) the server runs
from each of those checkouts in turn, `--rounds` times, alternating: code before and after a change measured
in one run, under the same load (the devices, the client and this table always come from this checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgerun.fleet.admin_client import AdminClient  # noqa: E402
from edgerun.fleet.local_postgres import LocalPostgres, postgres_bin_dir  # noqa: E402
from edgerun.fleet.manifest import verify_assignment, verify_release  # noqa: E402
from edgerun.fleet.package import pack_task  # noqa: E402
from edgerun.fleet.signing import KeyDir, Root  # noqa: E402
from edgerun.fleet.targeting import device_bucket, in_step, release_offset  # noqa: E402

STEPS = [1, 5, 20, 50, 100]


class HttpConnection:
    """A minimal HTTP/1.1 keep-alive client: the simulator must spend its CPU on devices, not on a client library."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        assert self.reader is not None
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)


@dataclass
class SimDevice:
    device_id: str
    token: str = ""
    tasks: dict[str, int] = field(default_factory=dict)
    serial: int = 0
    blobs: set[str] = field(default_factory=set)
    installed: set[int] = field(default_factory=set)  # every version it ever installed
    nudged_at: list[float] = field(default_factory=list)  # when its push stream said `changed`


@dataclass
class Counters:
    checkins: int = 0
    updates: int = 0
    reports: int = 0
    errors: int = 0
    first_failure_at: float = 0.0
    last_error: str = ""
    installed_at: dict[int, list[float]] = field(default_factory=dict)  # version → when each device got it
    latencies: list[float] = field(default_factory=list)
    streams: int = 0  # push streams open (--first-step with push)


class Simulator:
    def __init__(self, url: str, root: Root, devices: int, connections: int) -> None:
        host_port = url.split("//", 1)[1]
        host, port = host_port.split(":")
        self.pool: asyncio.Queue[HttpConnection] = asyncio.Queue()
        for _ in range(connections):
            self.pool.put_nowait(HttpConnection(host, int(port)))
        self.root = root
        self.devices = [SimDevice(f"sim-{i:06d}") for i in range(devices)]
        self.c = Counters()
        self.stop = False

    async def call(self, method: str, path: str, token: str, payload: Any = None) -> tuple[int, Any]:
        conn = await self.pool.get()
        body = json.dumps(payload).encode() if payload is not None else b""
        try:
            for attempt in (1, 2):  # a pooled connection the server closed while idle is reopened once
                try:
                    status, raw = await conn.request(method, path, token, body)
                    break
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    conn.writer = None
                    if attempt == 2:
                        self.c.errors += 1
                        return 0, None
        finally:
            self.pool.put_nowait(conn)
        if method == "GET" and path.startswith("/v1/blobs/"):
            return status, raw
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:  # not the server's answer (the balancer's own error page): counted by the caller
            self.c.last_error = f"HTTP {status}: {raw[:120]!r}"
            return status, None

    async def register_all(self, enroll_token: str, concurrency: int = 256) -> float:
        start = time.perf_counter()
        sem = asyncio.Semaphore(concurrency)

        async def one(d: SimDevice) -> None:
            async with sem:
                profile = {"device_id": d.device_id, "app_version": "2.0", "os": "android"}
                status, body = await self.call("POST", "/v1/devices/register", "",
                                               {"enroll_token": enroll_token, "profile": profile})
                assert status == 200, (status, body)
                d.token = body["token"]

        await asyncio.gather(*(one(d) for d in self.devices))
        return time.perf_counter() - start

    def preload(self, db_url: str, table_devices: int = 0) -> float:
        """Enrol every device straight into the database (what `register_all` leaves there, without its HTTP
        round trips): large fleets, where enrolment is not what is measured, start in seconds, not hours.
        `table_devices` above the simulated devices adds enrolled devices that never check in (the server's
        per-device costs against a table of that size, from a fleet this machine can drive)."""
        import secrets

        import psycopg

        from edgerun.fleet.server_tokens import token_hash

        start, now = time.perf_counter(), time.time()
        columns = "id, token_hash, profile, registered_at, last_seen, device_groups, bucket"
        silent = [SimDevice(f"idle-{i:07d}") for i in range(max(0, table_devices - len(self.devices)))]
        with (psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as conn,
              conn.cursor().copy(f"COPY devices ({columns}) FROM STDIN") as copy):
            for d in self.devices + silent:
                d.token = secrets.token_urlsafe(32)
                profile = {"device_id": d.device_id, "app_version": "2.0", "os": "android", "device_groups": [],
                           "user_groups": [], "tasks": {}}
                copy.write_row((d.device_id, token_hash(d.token), json.dumps(profile), now, now, "[]",
                                device_bucket(d.device_id)))
        return time.perf_counter() - start

    async def check_in(self, d: SimDevice) -> None:
        t0 = time.perf_counter()
        profile = {"device_id": d.device_id, "app_version": "2.0", "os": "android", "tasks": d.tasks,
                   "serial": d.serial}  # as the agent does: the highest serial it accepted
        status, body = await self.call("POST", f"/v1/devices/{d.device_id}/checkin", d.token, profile)
        self.c.latencies.append(time.perf_counter() - t0)
        if status != 200:
            self.c.errors += 1
            return
        self.c.checkins += 1
        if body["status"] == "up-to-date":
            serial = int(body["timestamp"]["signed"]["serial"])
            if serial < d.serial:  # the agent refuses a timestamp older than a serial it has accepted
                self.c.errors += 1
                self.c.last_error = f"timestamp #{serial} below #{d.serial}"
            d.serial = max(d.serial, serial)
        if body["status"] == "update":
            await self.apply(d, body["assignment"])

    async def apply(self, d: SimDevice, envelope: dict[str, Any]) -> None:
        signed = verify_assignment(self.root, envelope, device_id=d.device_id, min_serial=d.serial)
        d.serial = int(signed["serial"])
        reports = []
        for task, rel_env in signed["tasks"].items():
            m = verify_release(self.root, rel_env, task=task, min_version=d.tasks.get(task, 0))
            if d.tasks.get(task) == m["version"]:
                continue
            for f in m["files"]:
                if f["sha256"] in d.blobs:
                    continue
                status, data = await self.call("GET", f"/v1/blobs/{f['sha256']}", d.token)
                if status != 200 or len(data) != f["length"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
                    self.c.errors += 1
                    return
                d.blobs.add(f["sha256"])
            d.tasks[task] = int(m["version"])
            d.installed.add(int(m["version"]))
            self.c.installed_at.setdefault(int(m["version"]), []).append(time.perf_counter())
            self.c.updates += 1
            outcome = m["config"].get("sim_outcome", "success")
            if outcome != "success" and not self.c.first_failure_at:
                self.c.first_failure_at = time.perf_counter()
            reports.append({"id": f"{d.device_id}-{task}-{m['version']}", "task": task, "version": m["version"],
                            "outcome": outcome, "latency_ms": 1.0})
        if reports:
            status, _ = await self.call("POST", f"/v1/devices/{d.device_id}/reports", d.token, {"reports": reports})
            if status == 200:
                self.c.reports += len(reports)

    async def device_loop(self, d: SimDevice, interval_s: float) -> None:
        await asyncio.sleep(random.uniform(0, interval_s))
        while not self.stop:
            try:
                await self.check_in(d)
            except Exception as exc:  # a refused or malformed answer is counted, and the device goes on
                self.c.errors += 1
                self.c.last_error = repr(exc)
            if interval_s:
                await asyncio.sleep(interval_s * random.uniform(0.9, 1.1))

    async def prime(self, concurrency: int = 256) -> float:
        """Every device checks in once, as fast as the servers answer: each process looks up the identity of
        every device it serves once, as in a fleet that has been running, so that a measurement started right
        after it is steady at once instead of after a whole interval of cold check-ins."""
        start = time.perf_counter()
        sem = asyncio.Semaphore(concurrency)

        async def one(d: SimDevice) -> None:
            async with sem:
                await self.check_in(d)

        await asyncio.gather(*(one(d) for d in self.devices))
        return time.perf_counter() - start

    async def event_stream(self, d: SimDevice, host: str, port: int, opening: asyncio.Semaphore | None = None) -> None:
        """The device's push stream: a check-in on every `changed` nudge (and on every (re)connection).
        `opening` bounds how many devices connect and check in at once (thousands at once overflow backlogs)."""
        while not self.stop:
            writer = None
            try:
                if opening is not None:
                    await opening.acquire()
                try:
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(f"GET /v1/devices/{d.device_id}/events HTTP/1.1\r\nHost: {host}\r\n"
                                 f"Authorization: Bearer {d.token}\r\n\r\n".encode())
                    while (line := await reader.readline()) not in (b"\r\n", b""):
                        pass
                    self.c.streams += 1
                    await self.check_in(d)  # as the agent does on every (re)connection
                finally:
                    if opening is not None:
                        opening.release()
                while line := await reader.readline():  # chunk-size lines pass by; event lines are whole
                    if line.startswith(b"event: changed"):
                        d.nudged_at.append(time.perf_counter())
                        await self.check_in(d)
            except OSError:
                self.c.errors += 1
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(random.uniform(0.5, 1.0))

    def count_at(self, task: str, version: int) -> int:
        return sum(1 for d in self.devices if d.tasks.get(task) == version)


def start_server(base: Path, keys: KeyDir, workers: int, db_url: str, name: str = "data",
                 extra: tuple[str, ...] = (), tree: Path = REPO) -> tuple[subprocess.Popen[bytes], str]:
    """`edgerun fleet serve` from the checkout `tree` (this one unless comparing, see `--server-tree`)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "edgerun", "fleet", "serve", "--port", str(port), "--data", str(base / name),
           "--keys", str(keys.path), "--workers", str(workers),
           # every simulated device is on loopback, and the throughput runs check in back to back: the limits
           # would measure themselves, not the server
           "--rate-per-token", "0", "--rate-per-address", "0", *extra] + (["--db", db_url] if db_url else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "EDGERUN_FLEET_TOKEN": "admin", "EDGERUN_ENROLL_TOKEN": "enroll"}
    proc = subprocess.Popen(cmd, cwd=tree, env=env,  # tokens from the environment: never argv
                            stdout=subprocess.DEVNULL, stderr=open(base / f"{name}.log", "wb"))  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(1200):
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError((base / f"{name}.log").read_text())


@dataclass
class Servers:
    """One server (its worker processes), or `--replicas` of them as hosts would run them: each its own data
    folder, one PostgreSQL and one file store, behind nginx (Debian's package, the config of docs/fleet.md)."""

    procs: list[subprocess.Popen[bytes]]
    urls: list[str]  # each replica, directly (metrics)
    url: str         # where the devices and the admin go
    nginx: Any = None

    def cpu_s(self) -> float:
        return sum(tree_cpu_s(p.pid) for p in self.procs)

    def nginx_cpu_s(self) -> float:
        return tree_cpu_s(self.nginx.proc.pid) if self.nginx is not None else 0.0

    def checkins_per_replica(self) -> list[int]:
        """Check-ins each replica answered so far (its Prometheus counter)."""
        import httpx

        out = []
        for u in self.urls:
            text = httpx.get(u + "/metrics", timeout=10).text
            out.append(int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                               if line.startswith("edgerun_fleet_checkins_total{"))))
        return out

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(30)


def start_servers(base: Path, keys: KeyDir, workers: int, db_url: str, replicas: int, tree: Path = REPO,
                  nginx: bool = False) -> Servers:
    """`replicas` servers; behind nginx when there are several, or when `nginx` asks for it with one."""
    if replicas <= 1 and not nginx:
        proc, url = start_server(base, keys, workers, db_url, tree=tree)
        return Servers([proc], [url], url)
    if not db_url:
        raise SystemExit("--replicas and --matrix need --db postgres")
    from edgerun.fleet.load_balancer import LocalNginx

    started = [start_server(base, keys, workers, db_url, f"replica-{i}", ("--store", str(base / "blobs")), tree)
               for i in range(replicas)]
    balancer = LocalNginx([u for _, u in started]).start()
    return Servers([p for p, _ in started], [u for _, u in started], balancer.url, balancer)


STAT_STATEMENTS = "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = 'all'\n"


def statements(pg: LocalPostgres, reset: bool = False) -> int:
    """Statements the server ran since the last reset (pg_stat_statements), this bench's own queries aside."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if reset:
            conn.execute("SELECT pg_stat_statements_reset()")
            return 0
        row = conn.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
                           "WHERE query NOT ILIKE '%pg_stat_statements%'").fetchone()
        return int(row[0]) if row else 0


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, parent in parents.items() if parent == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(times.get(p, 0.0) for p in tree)


def coverage_times(stamps: list[float], since: float, total: int) -> dict[str, float]:
    """Seconds after `since` at which 50 %, 90 %, 99 % and 100 % of `total` devices had the version."""
    ordered = sorted(stamps)
    out = {}
    for q in (50, 90, 99, 100):
        k = max(1, -(-total * q // 100))
        out[f"p{q}_s"] = ordered[k - 1] - since if len(ordered) >= k else float("nan")
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_package(base: Path, version: int, outcome: str) -> Path:
    src = base / f"src-{version}"
    src.mkdir()
    (src / "task.json").write_text(json.dumps({"name": "simtask", "version": version, "sim_outcome": outcome}))
    (src / "main.py").write_text(f"def run(inputs):\n    return {{'v': {version}}}\n")
    (src / "model.bin").write_bytes(os.urandom(4096))
    pkg = base / f"simtask-{version}.tar"
    pack_task(src, pkg)
    return pkg


async def wait_until(cond: Any, timeout_s: float, progress: Any = None, poll_s: float = 0.05) -> float:
    start = last = time.perf_counter()
    while not cond():
        now = time.perf_counter()
        if now - start > timeout_s:
            raise TimeoutError("simulation did not converge")
        if progress is not None and now - last >= 10:
            log(progress())
            last = now
        await asyncio.sleep(poll_s)
    return time.perf_counter() - start


async def run_scenario(db: str, args: argparse.Namespace, tree: Path = REPO) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"fleet-sim-{db}-"))
    keys = KeyDir(base / "keys")
    keys.init()
    load_at_start = os.getloadavg()[0]
    pg = LocalPostgres().start(STAT_STATEMENTS) if db == "postgres" else None
    servers = start_servers(base, keys, args.workers, pg.url if pg else "", args.replicas, tree)
    url = servers.url
    admin = AdminClient(url, "admin")
    try:
        sim = Simulator(url, Root(keys.root_chain()[-1]), args.devices, args.connections)
        if args.preload and pg is not None:
            register_s = sim.preload(pg.url, args.table_devices)
            log(f"[{db}] preloaded {max(args.devices, args.table_devices)} devices into the database in {register_s:.1f}s")
        else:
            register_s = await sim.register_all("enroll")
            log(f"[{db}] registered {args.devices} devices in {register_s:.1f}s")

        # 1. The fleet's own load: each device on its own schedule, up to date.
        sim.stop = False
        loops = [asyncio.create_task(sim.device_loop(d, args.checkin_interval)) for d in sim.devices]
        # Warm-up of one whole interval: every device has checked in once, as in a fleet that has been running
        # (identities cached), and the schedules are spread.
        await asyncio.sleep(args.checkin_interval)
        # The warm-up is every device's first check-in to a process that has not seen it (a cold start).
        warm_lat, warm_checkins = sorted(sim.c.latencies), sim.c.checkins
        sim.c = Counters()
        if pg is not None:
            statements(pg, reset=True)
        spread0 = servers.checkins_per_replica()
        t0, server_cpu0, client_cpu0 = time.perf_counter(), servers.cpu_s(), time.process_time()
        nginx_cpu0 = servers.nginx_cpu_s()
        await asyncio.sleep(args.duration)
        sustained = sim.c.checkins / (time.perf_counter() - t0)
        server_cpu = servers.cpu_s() - server_cpu0
        nginx_cpu = servers.nginx_cpu_s() - nginx_cpu0
        spread = [b - a for a, b in zip(spread0, servers.checkins_per_replica(), strict=True)]
        client_cpu = time.process_time() - client_cpu0
        per_checkin = statements(pg) / sim.c.checkins if pg is not None and sim.c.checkins else None
        per_server_cpu_s = sim.c.checkins / server_cpu if server_cpu else None
        lat = sorted(sim.c.latencies)
        sim.stop = True
        if args.load_only:  # nothing follows: end each device's sleep now rather than up to 1.1 intervals on
            for loop in loops:
                loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        log(f"[{db}] {sustained:.0f} check-ins/s offered {args.devices / args.checkin_interval:.0f}/s "
            f"({server_cpu:.1f} server CPU s, {client_cpu:.1f} client CPU s in {args.duration:.0f} s; "
            f"statements per check-in {per_checkin})")

        row = {
            "server_tree": str(tree), "load_average_start": load_at_start,
            "db": db, "devices": args.devices, "table_devices": max(args.devices, args.table_devices),
            "server_workers": args.workers, "replicas": args.replicas,
            "checkins_per_replica": spread, "nginx_cpu_s": nginx_cpu, "connections": args.connections,
            "register_per_s": None if args.preload else args.devices / register_s, "checkin_interval_s_sustained": args.checkin_interval,
            "offered_checkins_per_s": args.devices / args.checkin_interval,
            "checkins_per_s": sustained, "checkins_per_server_cpu_s": per_server_cpu_s,
            "statements_per_checkin": per_checkin,
            "server_cpu_s": server_cpu, "client_cpu_s": client_cpu, "load_average": os.getloadavg()[0],
            "checkin_latency_ms_p50": 1000 * statistics.median(lat) if lat else None,
            "checkin_latency_ms_p99": 1000 * lat[int(0.99 * (len(lat) - 1))] if lat else None,
            "warmup_checkins": warm_checkins,
            "warmup_latency_ms_p50": 1000 * statistics.median(warm_lat) if warm_lat else None,
            "warmup_latency_ms_p99": 1000 * warm_lat[int(0.99 * (len(warm_lat) - 1))] if warm_lat else None,
        }
        if args.load_only:
            return {**row, "gray_release_to_all_s": None, "first_failure_to_rollback_everywhere_s": None,
                    "client_errors": sim.c.errors}

        # 2. A gray release to every device, devices checking in every `interval` seconds.
        sim.stop = False
        loops = [asyncio.create_task(sim.device_loop(d, args.interval)) for d in sim.devices]
        policy = {"steps": STEPS, "min_reports": args.min_reports, "success_threshold": 0.95,
                  "error_threshold": 0.2, "error_min_reports": min(20, args.min_reports)}
        t_pub = time.perf_counter()
        good = admin.publish(make_package(base, 2, "success"), keys, policy)
        gray_s = await wait_until(lambda: sim.count_at("simtask", 2) == args.devices, args.timeout,
                                  lambda: f"  {sim.count_at('simtask', 2)} devices on v2; errors {sim.c.errors} {sim.c.last_error}")
        gray_state = admin.release(good["id"])["stage"]
        gray_spread = [b - a for a, b in zip(spread0, servers.checkins_per_replica(), strict=True)]
        publish_to_all_s = time.perf_counter() - t_pub
        log(f"[{db}] gray release reached {args.devices} devices in {gray_s:.1f}s ({gray_state})")

        # 3. A bad version: first failures → rollback version on every device.
        sim.c.first_failure_at = 0.0
        bad = admin.publish(make_package(base, 4, "failure"), keys, policy)
        await wait_until(lambda: sim.c.first_failure_at > 0, args.timeout)
        await wait_until(lambda: sim.count_at("simtask", 5) == args.devices, args.timeout,
                         lambda: f"  {sim.count_at('simtask', 5)} devices on v5; errors {sim.c.errors} {sim.c.last_error}")
        rollback_all_s = time.perf_counter() - sim.c.first_failure_at
        gray_coverage = coverage_times(sim.c.installed_at.get(2, []), t_pub, args.devices)
        rollback_coverage = coverage_times(sim.c.installed_at.get(5, []), sim.c.first_failure_at, args.devices)
        bad_state = admin.release(bad["id"])
        ever_bad = sum(1 for d in sim.devices if "simtask" in d.tasks)  # all on v5 now
        sim.stop = True
        await asyncio.gather(*loops)
        return {
            **row, "gray_release_to_all_s": gray_s, "gray_publish_to_all_s": publish_to_all_s, "gray_final_stage": gray_state,
            "checkins_per_replica_to_gray_end": gray_spread,
            "bad_release_stage": bad_state["stage"], "bad_release_failures": bad_state["total_failure"],
            "first_failure_to_rollback_everywhere_s": rollback_all_s, "devices_on_rollback_version": ever_bad,
            "checkin_interval_s": args.interval, "client_errors": sim.c.errors,
            "gray_coverage_after_publish": gray_coverage, "rollback_coverage_after_first_failure": rollback_coverage,
        }
    finally:
        admin.close()
        servers.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)


async def run_first_step(db: str, args: argparse.Namespace, push: bool) -> dict[str, Any]:
    """A release's first step (1%) reaching every device it targets, polling alone or with push."""
    base = Path(tempfile.mkdtemp(prefix=f"fleet-sim-first-{db}-"))
    keys = KeyDir(base / "keys")
    keys.init()
    pg = LocalPostgres().start() if db == "postgres" else None
    proc, url = start_server(base, keys, args.workers, pg.url if pg else "")
    admin = AdminClient(url, "admin")
    host, port = url.split("//", 1)[1].split(":")
    try:
        sim = Simulator(url, Root(keys.root_chain()[-1]), args.devices, args.connections)
        await sim.register_all("enroll")
        loops = [asyncio.create_task(sim.device_loop(d, args.poll_interval)) for d in sim.devices]
        streams = [asyncio.create_task(sim.event_stream(d, host, int(port))) for d in sim.devices] if push else []
        if push:
            await wait_until(lambda: sim.c.streams >= args.devices, args.timeout)
        await asyncio.sleep(2.0)
        version = 2
        offset = release_offset("simtask", version)
        targeted = [d for d in sim.devices if in_step(device_bucket(d.device_id), offset, STEPS[0])]
        policy = {"steps": STEPS, "min_reports": 10 * args.devices}  # stays on its first step
        t_pub = time.perf_counter()
        admin.publish(make_package(base, version, "success"), keys, policy)
        reach_s = await wait_until(lambda: all(d.tasks.get("simtask") == version for d in targeted), args.timeout)
        others = sum(1 for d in sim.devices if d.tasks.get("simtask") == version) - len(targeted)
        sim.stop = True
        for t in loops + streams:
            t.cancel()
        await asyncio.gather(*loops, *streams, return_exceptions=True)
        log(f"[{db}] {'push' if push else 'poll'}: first step reached its {len(targeted)} devices in {reach_s:.1f}s")
        return {"db": db, "mode": "push+poll" if push else "poll", "devices": args.devices,
                "poll_interval_s": args.poll_interval, "targeted": len(targeted), "untargeted_updated": others,
                "first_step_to_all_targeted_s": reach_s, "publish_to_all_targeted_s": time.perf_counter() - t_pub,
                "client_errors": sim.c.errors, "load_average": os.getloadavg()[0]}
    finally:
        admin.close()
        proc.terminate()
        proc.wait(30)
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def targeted_by_first_step(devices: list[SimDevice], version: int) -> list[SimDevice]:
    """The devices a release of `simtask` at `version` targets at its first gray step (its bucket range)."""
    offset = release_offset("simtask", version)
    return [d for d in devices if in_step(device_bucket(d.device_id), offset, STEPS[0])]


def percentile_ms(ordered: list[float], q: float) -> float | None:
    return 1000 * ordered[int(q * (len(ordered) - 1))] if ordered else None


async def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration of the fleet's measurement matrix, every figure from one run: `--replicas` servers
    (one process each) on PostgreSQL, always behind nginx, `--devices` enrolled by COPY.

    1. Warm-up: every device checks in once (`Simulator.prime`).
    2. The fleet's own load for `--duration` s, every device on its own schedule (every `--checkin-interval`
       s, jittered, random phase): check-ins per server CPU-second (the replicas' process trees; nginx apart),
       statements per check-in (pg_stat_statements, everything the replicas ran in the window).
    3. Push streams through nginx for `--streams` devices (every device the two releases below target first,
       then others), the schedules still running as the agent's fallback poll; a release published with
       steps 1% → 100%: the time from the publish to its 1% step running on every device it targets.
    4. A bad version, published the same way: the time from its first failure on a device to the rollback
       version running on every device that ran the bad version.
    """
    base = Path(tempfile.mkdtemp(prefix="fleet-sim-matrix-"))
    keys = KeyDir(base / "keys")
    keys.init()
    loads = {"start": os.getloadavg()[0]}
    pg = LocalPostgres().start(STAT_STATEMENTS)
    servers = start_servers(base, keys, 1, pg.url, args.replicas, nginx=True)
    admin = AdminClient(servers.url, "admin")
    host, port = servers.url.split("//", 1)[1].split(":")
    tasks: list[asyncio.Task[None]] = []
    sim = Simulator(servers.url, Root(keys.root_chain()[-1]), args.devices, args.connections)
    try:
        preload_s = sim.preload(pg.url, args.table_devices)
        log(f"preloaded {max(args.devices, args.table_devices)} devices in {preload_s:.1f}s")

        # 1. Warm-up.
        prime_s = await sim.prime()
        warm_lat, warm_errors = sorted(sim.c.latencies), sim.c.errors
        log(f"warm-up: {args.devices} first check-ins in {prime_s:.1f}s ({warm_errors} errors {sim.c.last_error})")

        # 2. The fleet's own load.
        tasks += [asyncio.create_task(sim.device_loop(d, args.checkin_interval)) for d in sim.devices]
        await asyncio.sleep(args.settle)
        sim.c = Counters()
        statements(pg, reset=True)
        loads["window_start"] = os.getloadavg()[0]
        spread0 = servers.checkins_per_replica()
        t0, server_cpu0, nginx_cpu0, client_cpu0 = (time.perf_counter(), servers.cpu_s(), servers.nginx_cpu_s(),
                                                    time.process_time())
        await asyncio.sleep(args.duration)
        window_s = time.perf_counter() - t0
        checkins, stmts = sim.c.checkins, statements(pg)
        server_cpu, nginx_cpu = servers.cpu_s() - server_cpu0, servers.nginx_cpu_s() - nginx_cpu0
        client_cpu = time.process_time() - client_cpu0
        spread = [b - a for a, b in zip(spread0, servers.checkins_per_replica(), strict=True)]
        lat, window_errors = sorted(sim.c.latencies), sim.c.errors
        loads["window_end"] = os.getloadavg()[0]
        log(f"window: {checkins / window_s:.0f} check-ins/s of {args.devices / args.checkin_interval:.0f} offered, "
            f"{checkins / server_cpu if server_cpu else 0:.0f} per server CPU-s, "
            f"{stmts / checkins if checkins else 0:.2f} statements each")

        # 3. Push streams, and a release's first step.
        good_targets, bad_targets = targeted_by_first_step(sim.devices, 2), targeted_by_first_step(sim.devices, 4)
        first = {d.device_id: d for d in good_targets + bad_targets}
        holders = [*first.values(), *(d for d in sim.devices if d.device_id not in first)][:max(args.streams, len(first))]
        opening = asyncio.Semaphore(128)
        t_open = time.perf_counter()
        tasks += [asyncio.create_task(sim.event_stream(d, host, int(port), opening)) for d in holders]
        await wait_until(lambda: sim.c.streams >= len(holders), args.timeout,
                         lambda: f"  {sim.c.streams} of {len(holders)} streams open")
        open_s = time.perf_counter() - t_open
        await asyncio.sleep(2.0)  # the last stream's check-in answered, nothing in flight
        log(f"{len(holders)} push streams open in {open_s:.1f}s")
        held = {"steps": STEPS, "min_reports": 10 * args.devices}  # a step that never advances on its own
        push_cpu0, t_pub = servers.cpu_s(), time.perf_counter()
        admin.publish(make_package(base, 2, "success"), keys, held)
        reach_s = await wait_until(lambda: all(d.tasks.get("simtask") == 2 for d in good_targets), args.timeout)
        publish_to_all_s = time.perf_counter() - t_pub
        push_server_cpu = servers.cpu_s() - push_cpu0  # the replicas' CPU from the publish to the last install
        strays = sum(1 for d in sim.devices if d.tasks.get("simtask") == 2) - len(good_targets)
        log(f"push: the 1% step reached its {len(good_targets)} devices {publish_to_all_s:.2f}s after the publish")

        # 4. A bad version and its rollback.
        sim.c.first_failure_at = 0.0
        bad = admin.publish(make_package(base, 4, "failure"), keys,
                            {**held, "error_threshold": 0.2, "error_min_reports": args.error_min_reports})
        await wait_until(lambda: sim.c.first_failure_at > 0, args.timeout)
        while (await asyncio.to_thread(admin.release, bad["id"]))["stage"] != "rolled_back":
            await asyncio.sleep(0.1)
        rolled_back_s = time.perf_counter() - sim.c.first_failure_at
        # Every device that ran the bad version runs its rollback (the task's removal, signed as v5).
        def ran_bad() -> list[SimDevice]:
            return [d for d in bad_targets if 4 in d.installed]

        await wait_until(lambda: all(d.tasks.get("simtask") == 5 for d in ran_bad()), args.timeout,
                         lambda: f"  {sum(d.tasks.get('simtask') == 5 for d in ran_bad())} of {len(ran_bad())} on v5")
        rollback_s = time.perf_counter() - sim.c.first_failure_at
        bad_state = admin.release(bad["id"])
        log(f"rollback on the {len(ran_bad())} devices that ran the bad version {rollback_s:.2f}s after the first failure "
            f"({bad_state['stage']}, {bad_state['total_failure']} failures counted)")
        loads["end"] = os.getloadavg()[0]
        headline = {"devices": args.devices, "replicas": args.replicas, "checkins_per_s": checkins / window_s,
                    "checkins_per_server_cpu_s": checkins / server_cpu if server_cpu else None,
                    "statements_per_checkin": stmts / checkins if checkins else None,
                    "publish_to_first_step_everywhere_s": publish_to_all_s,
                    "first_failure_to_rollback_everywhere_s": rollback_s}
        return {
            **headline, "table_devices": max(args.devices, args.table_devices), "db": "postgres",
            "replicas": args.replicas, "server_workers": 1, "nginx": True, "connections": args.connections,
            "preload_s": preload_s, "warmup_s": prime_s, "warmup_checkins_per_s": args.devices / prime_s,
            "warmup_latency_ms_p50": percentile_ms(warm_lat, 0.5), "warmup_latency_ms_p99": percentile_ms(warm_lat, 0.99),
            "warmup_errors": warm_errors,
            "checkin_interval_s": args.checkin_interval, "window_s": window_s,
            "offered_checkins_per_s": args.devices / args.checkin_interval, "checkins_per_s": checkins / window_s,
            "checkins_per_server_cpu_s": checkins / server_cpu if server_cpu else None,
            "checkins_per_server_and_nginx_cpu_s": checkins / (server_cpu + nginx_cpu) if server_cpu else None,
            "statements_per_checkin": stmts / checkins if checkins else None,
            "server_cpu_s": server_cpu, "nginx_cpu_s": nginx_cpu, "client_cpu_s": client_cpu,
            "checkins_per_replica": spread,
            "checkin_latency_ms_p50": percentile_ms(lat, 0.5), "checkin_latency_ms_p99": percentile_ms(lat, 0.99),
            "window_errors": window_errors,
            "push_streams": len(holders), "streams_open_s": open_s,
            "first_step_targeted": len(good_targets), "publish_to_first_step_everywhere_s": publish_to_all_s,
            "first_step_reached_after_publish_returned_s": reach_s, "untargeted_updated": strays,
            "first_step_coverage_after_publish": coverage_times(sim.c.installed_at.get(2, []), t_pub, len(good_targets)),
            "push_server_cpu_s": push_server_cpu,
            "first_step_nudged_after_publish": coverage_times(
                [min(t for t in d.nudged_at if t >= t_pub) for d in good_targets if any(t >= t_pub for t in d.nudged_at)],
                t_pub, len(good_targets)),
            "bad_first_step_targeted": len(bad_targets), "bad_release_stage": bad_state["stage"],
            "bad_release_failures": bad_state["total_failure"], "devices_ran_bad_version": len(ran_bad()),
            "first_failure_to_rolled_back_s": rolled_back_s, "first_failure_to_rollback_everywhere_s": rollback_s,
            "rollback_coverage_after_first_failure": coverage_times(sim.c.installed_at.get(5, []),
                                                                    sim.c.first_failure_at, len(ran_bad())),
            "client_errors": sim.c.errors, "load_averages": loads, "load_average": loads["end"],
        }
    finally:
        sim.stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        admin.close()
        servers.stop()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=10_000)
    p.add_argument("--db", action="append", choices=("sqlite", "postgres"), help="repeatable (default: both)")
    p.add_argument("--workers", type=int, default=2, help="server processes (of each replica)")
    p.add_argument("--replicas", type=int, default=1,
                   help="servers as separate hosts would run them, behind nginx (PostgreSQL only)")
    p.add_argument("--preload", action="store_true",
                   help="PostgreSQL: write the devices' enrolments straight into the database (large fleets)")
    p.add_argument("--table-devices", type=int, default=0,
                   help="with --preload: enrol this many devices in all, those beyond --devices never checking in")
    p.add_argument("--connections", type=int, default=64, help="keep-alive connections shared by the devices")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of the fleet-load measurement")
    p.add_argument("--checkin-interval", type=float, default=60.0,
                   help="during the fleet-load measurement: seconds between one device's check-ins")
    p.add_argument("--interval", type=float, default=1.0, help="check-in interval during the releases")
    p.add_argument("--min-reports", type=int, default=0,
                   help="reports a step needs (default: half the devices of the 1%% step, at least 5)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--load-only", action="store_true", help="only the fleet-load measurement (no releases)")
    p.add_argument("--first-step", action="store_true",
                   help="only: a release's first step reaching its devices, polling alone against push")
    p.add_argument("--poll-interval", type=float, default=60.0, help="with --first-step: the polling interval")
    p.add_argument("--server-tree", action="append", type=Path,
                   help="a checkout whose edgerun serves (repeatable: each in turn, to compare; default: this one)")
    p.add_argument("--rounds", type=int, default=1, help="with --server-tree: how many times each is measured")
    p.add_argument("--matrix", action="store_true",
                   help="only: one configuration of the measurement matrix (PostgreSQL, --replicas behind nginx): "
                        "check-ins per server CPU-second, statements per check-in, push to a 1%% step, rollback")
    p.add_argument("--streams", type=int, default=10_000,
                   help="with --matrix: devices holding push streams (those the releases target first, then "
                        "others); each stream is two of nginx's connections and a file descriptor in every process")
    p.add_argument("--settle", type=float, default=5.0,
                   help="with --matrix: seconds of schedules running between the warm-up and the window")
    p.add_argument("--error-min-reports", type=int, default=10,
                   help="with --matrix: failures the bad version's first step needs before it is rolled back")
    p.add_argument("--out", default="")
    args = p.parse_args()
    args.min_reports = args.min_reports or max(5, args.devices // 200)
    if args.matrix:
        return matrix_main(args)
    args.out = args.out or str(REPO / "bench" / "results" / "fleet_sim.json")
    dbs = args.db or (["sqlite", "postgres"] if postgres_bin_dir() else ["sqlite"])
    if args.first_step:
        rows = [asyncio.run(run_first_step(db, args, push)) for db in dbs for push in (False, True)]
        print("db | mode | devices | poll interval s | targeted | first step to all targeted s | client errors")
        for r in rows:
            print(f"{r['db']} | {r['mode']} | {r['devices']} | {r['poll_interval_s']:.0f} | {r['targeted']} | "
                  f"{r['first_step_to_all_targeted_s']:.1f} | {r['client_errors']}")
        out = Path(args.out).with_name("fleet_sim_push.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(),
                                   "load_average": [r["load_average"] for r in rows], "results": rows}, indent=1))
        print(f"wrote {out}")
        return 0
    trees = [t.resolve() for t in args.server_tree] if args.server_tree else [REPO]
    results = [asyncio.run(run_scenario(db, args, tree)) for _ in range(args.rounds) for db in dbs for tree in trees]
    cols = [*([("server_tree", "{}")] if len(trees) > 1 else []), ("load_average_start", "{:.1f}"), ("db", "{}"), ("devices", "{}"),
            ("table_devices", "{}"), ("replicas", "{}"), ("server_workers", "{}"), ("register_per_s", "{:.0f}"),
            ("offered_checkins_per_s", "{:.0f}"), ("checkins_per_s", "{:.0f}"),
            ("checkins_per_server_cpu_s", "{:.0f}"), ("statements_per_checkin", "{:.2f}"), ("load_average", "{:.1f}"),
            ("checkin_latency_ms_p50", "{:.1f}"), ("checkin_latency_ms_p99", "{:.1f}"),
            ("warmup_latency_ms_p50", "{:.1f}"), ("warmup_latency_ms_p99", "{:.1f}"),
            ("gray_release_to_all_s", "{:.1f}"), ("first_failure_to_rollback_everywhere_s", "{:.1f}"),
            ("client_errors", "{}")]
    print(" | ".join(c for c, _ in cols))
    for r in results:
        print(" | ".join(f.format(r[c]) if r[c] is not None else "-" for c, f in cols))
    for r in results:
        if r["replicas"] > 1:
            print(f"{r['db']}: check-ins answered by each replica in the load window {r['checkins_per_replica']}"
                  + (f", up to the gray release's end {r['checkins_per_replica_to_gray_end']}"
                     if r.get("checkins_per_replica_to_gray_end") else "")
                  + f"; nginx {r['nginx_cpu_s']:.1f} CPU s in the load window")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(),
                               "load_average": [r["load_average"] for r in results], "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


def matrix_main(args: argparse.Namespace) -> int:
    if postgres_bin_dir() is None:
        raise SystemExit("--matrix needs PostgreSQL (Debian package `postgresql`)")
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if args.streams + args.connections + 200 > soft:
        raise SystemExit(f"--streams {args.streams}: this process may open {soft} files (ulimit -n)")
    row = asyncio.run(run_matrix(args))
    cols = [("devices", "{}"), ("replicas", "{}"), ("offered_checkins_per_s", "{:.0f}"), ("checkins_per_s", "{:.0f}"),
            ("checkins_per_server_cpu_s", "{:.0f}"), ("checkins_per_server_and_nginx_cpu_s", "{:.0f}"),
            ("statements_per_checkin", "{:.2f}"), ("checkin_latency_ms_p50", "{:.1f}"),
            ("checkin_latency_ms_p99", "{:.1f}"), ("push_streams", "{}"), ("first_step_targeted", "{}"),
            ("publish_to_first_step_everywhere_s", "{:.2f}"), ("first_failure_to_rollback_everywhere_s", "{:.2f}"),
            ("client_errors", "{}")]
    print(" | ".join(c for c, _ in cols))
    print(" | ".join(f.format(row[c]) if row[c] is not None else "-" for c, f in cols))
    print(f"load average {row['load_averages']}; check-ins per replica {row['checkins_per_replica']}; "
          f"nginx {row['nginx_cpu_s']:.1f} CPU-s, the devices {row['client_cpu_s']:.1f} CPU-s in the window")
    out = Path(args.out or REPO / "bench" / "results" /
               f"fleet_sim_matrix_{args.devices // 1000}k_{args.replicas}r.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["bench/fleet_sim.py", *sys.argv[1:]]),
                               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
                               "cpus": os.cpu_count(), "load_average": row["load_average"], "results": [row]},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
