"""The release server: a FastAPI app over the fleet database and the content-addressed store.

Several processes may serve one database and one store (PostgreSQL plus a shared folder or S3); every
piece of state lives there, and each process only caches what it can refresh within `cache_ttl_s`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from edgerun.fleet import checkin_path, server_tokens
from edgerun.fleet.admin_api import build_admin_router
from edgerun.fleet.api_models import (
    CheckinAnswer,
    CheckinRequest,
    Profile,
    RegisterRequest,
    ReportBatch,
)
from edgerun.fleet.blob_response import SmallBlobs, blob_response, small_blob_response
from edgerun.fleet.database import create_engine, sqlite_url, upgrade
from edgerun.fleet.errors import FleetError
from edgerun.fleet.freshness import TIMESTAMP_LIFETIME_S
from edgerun.fleet.group_commit import ReportGroupCommit
from edgerun.fleet.metrics import CONTENT_TYPE_LATEST, FleetMetrics
from edgerun.fleet.push_channel import CHECK_S, ReleaseWatch, device_events
from edgerun.fleet.rate_limit import Rate, RateLimit
from edgerun.fleet.release_notify import Listener
from edgerun.fleet.s3_store import S3Options
from edgerun.fleet.service import (
    IDENTITY_TTL_S,
    NOTIFIED_IDENTITY_TTL_S,
    SEEN_RESOLUTION_S,
    DeviceIdentity,
    EnrolmentError,
    FleetService,
)
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.simulation import SimulationWorker
from edgerun.fleet.step_monitor import StepMonitor
from edgerun.fleet.store import BlobStore, check_digest, open_store
from edgerun.fleet.stream_mount import stream_router
from edgerun.fleet.targeting import DeviceProfile
from edgerun.stream.body_limit import BodyLimit, BodyRule, Scope, bearer
from edgerun.stream.cloud import MAX_BATCH_BYTES
from edgerun.stream.large_records import MAX_PART_BODY

log = logging.getLogger("edgerun.fleet.server")
PUSH_FALLBACK_POLL_S = 5.0  # with PostgreSQL NOTIFY the poll only catches a notification lost in a reconnect
PROFILE_HEADER = "X-Edgerun-Profile"
ASSIGNMENT_HEADER = "X-Edgerun-Assignment"
DASHBOARD = Path(__file__).with_name("dashboard.html")


@dataclass
class ServerConfig:
    data_dir: Path
    keys_dir: Path
    db_url: str = ""
    store: str = ""
    admin_token: str = ""
    enroll_token: str = ""
    cache_ttl_s: float = 0.0         # release-table re-read; 0: 0.2 s on SQLite, 5 s with NOTIFY (PostgreSQL)
    s3_endpoint_url: str = ""     # for an s3:// store; empty fields fall back to the AWS_* environment
    s3_region: str = ""
    s3_access_key_id: str = ""
    monitor_interval_s: float = 1.0  # how often steps are re-evaluated against the live device count
    timestamp_ttl_s: float = TIMESTAMP_LIFETIME_S  # lifetime of the signed timestamp on "up to date" answers
    max_blob_mb: int = 1024          # largest file an admin may upload (the body is held in memory)
    enroll_token_uses: int = 0       # new devices the server's own enrolment token may enrol in all; 0: any
    db_pool_size: int = 10           # PostgreSQL connections kept per server process
    db_max_overflow: int = 20        # and opened beyond them under bursts
    db_statement_timeout_ms: int = 30_000  # PostgreSQL cancels a statement (lock waits included) past this
    identity_cache_size: int = 100_000     # device tokens whose identity a process keeps (for 10 s each)
    seen_resolution_s: float = SEEN_RESOLUTION_S  # how stale a stored last-seen time may be (service.flush_seen)
    rate_per_token: str = "20/s:200"       # each bearer token: 20 requests a second, bursts of 200 ("0": none)
    rate_per_address: str = "1000/s:5000"  # each client address (carrier NAT puts many devices behind one)
    push_poll_s: float = 0.0         # release-table poll of the push watch; 0: 0.5 s on SQLite, 5 s with NOTIFY


DATABASE_UNAVAILABLE = "the database is unavailable; retry shortly"
STATEMENT_TIMED_OUT = "a database statement ran past the server's time limit (--db-statement-timeout-ms); retry shortly"
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout

# Body limits per route, enforced while the body is read (edgerun.stream.body_limit), after the caller's
# token is checked from the headers alone.
SMALL_BODY = 64 * 1024               # enrolment, check-in, anything unlisted
REPORTS_BODY = 4 * 1024 * 1024       # 500 reports with 2,000-character errors fit
ADMIN_BODY = 16 * 1024 * 1024        # release manifests, root chains


def _secret(path: Path, given: str) -> tuple[str, bool]:
    """An explicit token wins; otherwise one is generated once and kept in DATA/<name> (mode 600).
    Returns the token and whether this call created its file."""
    if given:
        return given, False
    created = not path.exists()
    if created:  # created 0600 at once: a write-then-chmod leaves a moment where others may read it
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip(), created


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        raise HTTPException(401, "missing bearer token")
    return auth[7:].strip()


def prepare(cfg: ServerConfig) -> ServerConfig:
    """Migrate, resolve the tokens and install their hashes for every replica (server_tokens.py); run before
    any worker process starts, and again (a no-op by then) by each worker."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    engine = create_engine(cfg.db_url or sqlite_url(cfg.data_dir))
    try:
        upgrade(engine)
        installs = {"admin_token": lambda t, given, path: server_tokens.install_admin_token(engine, t, given, path),
                    "enroll_token": lambda t, given, path: server_tokens.install_enrolment_token(
                        engine, t, given, path, cfg.enroll_token_uses or None)}
        for name, install in installs.items():
            path, given = cfg.data_dir / name, getattr(cfg, name)
            token, created = _secret(path, given)
            try:
                install(token, bool(given), path)
            except FleetError:
                if created:  # leave no generated file behind that the operator might take for the shared one
                    path.unlink()
                raise
            setattr(cfg, name, token)
    finally:
        engine.dispose()
    return cfg


class PiggybackPush:
    """Pure ASGI middleware (BaseHTTPMiddleware would cost every request a task switch) that adds
    X-Edgerun-Assignment to the response of any request carrying X-Edgerun-Profile."""

    def __init__(self, app: Any, header_value: Any) -> None:
        self.app, self.header_value = app, header_value

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if b"x-edgerun-profile" not in headers:
            await self.app(scope, receive, send)
            return
        value = await self.header_value(headers)

        async def send_with_header(message: Any) -> None:
            if message["type"] == "http.response.start" and value is not None:
                message = {**message, "headers": [*message.get("headers", []),
                                                   (ASSIGNMENT_HEADER.lower().encode(), value.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def create_app(cfg: ServerConfig, clock: Callable[[], float] = time.monotonic) -> FastAPI:
    """The server of one process; `clock` (monotonic seconds) paces its rate limits and its caches' lifetimes
    (tests pass their own)."""
    per_token, per_address = Rate.parse(cfg.rate_per_token), Rate.parse(cfg.rate_per_address)
    cfg = prepare(cfg)
    engine = create_engine(cfg.db_url or sqlite_url(cfg.data_dir), cfg.db_pool_size, cfg.db_max_overflow,
                           cfg.db_statement_timeout_ms)
    keys = KeyDir(cfg.keys_dir)
    store: BlobStore = open_store(cfg.store, cfg.data_dir, S3Options(
        cfg.s3_endpoint_url, cfg.s3_region, cfg.s3_access_key_id))
    postgres = engine.dialect.name == "postgresql"
    # With PostgreSQL every release change is announced to every replica at its commit (NOTIFY, which drops the
    # cache at once), so the periodic re-read only catches a notification lost in a reconnect.
    release_ttl_s = cfg.cache_ttl_s or (PUSH_FALLBACK_POLL_S if postgres else 0.2)
    service = FleetService(engine, keys.key("assignment"), release_ttl_s, cfg.timestamp_ttl_s,
                           online_key_loader=lambda: keys.key("assignment"), clock=clock,
                           identity_cache_size=cfg.identity_cache_size, seen_resolution_s=cfg.seen_resolution_s,
                           identity_ttl_s=NOTIFIED_IDENTITY_TTL_S if postgres else IDENTITY_TTL_S)
    service.add_roots(keys.root_chain())
    simulator = SimulationWorker(engine, store, on_change=service.invalidate)
    group_commit = ReportGroupCommit(service)
    metrics = FleetMetrics()
    pool = engine.pool
    metrics.watch_pool(lambda: int(getattr(pool, "checkedout", lambda: 0)()))
    def monitor_round(leading: bool) -> None:
        metrics.leader.set(int(leading))
        if leading:
            metrics.monitor_ticks.inc()

    step_monitor = StepMonitor(engine, cfg.monitor_interval_s, on_change=service.invalidate, on_round=monitor_round)
    stop = threading.Event()
    draining = threading.Event()  # set by SIGTERM: readiness fails, push streams end, in-flight requests finish
    # With PostgreSQL, NOTIFY tells every replica of a change at once and the poll is only a fallback.
    watch = ReleaseWatch(service, cfg.push_poll_s or (PUSH_FALLBACK_POLL_S if postgres else CHECK_S),
                         checks=metrics.push_checks, nudges=metrics.push_nudges)
    listener = Listener(engine, watch.kick, service.forget) if postgres else None
    blob_downloads: dict[str, int] = {}  # digest -> GETs served by this process (operators, tests)
    small_blobs = SmallBlobs()

    def flush_loop() -> None:
        while not stop.wait(1.0):
            try:
                service.flush_seen()
            except Exception as exc:  # a busy database must not end the loop; the next second retries
                log.warning("last-seen flush failed", extra={"error": repr(exc)})

    serving_loop: list[asyncio.AbstractEventLoop] = []

    def begin_drain() -> None:
        """Readiness turns 503 and every push stream ends (its agent reconnects through the balancer). Safe from
        a signal handler: what takes a lock the interrupted code might hold runs later, on the event loop."""
        draining.set()
        watch.close()
        if serving_loop:
            serving_loop[0].call_soon_threadsafe(metrics.draining.set, 1)

    def on_startup() -> None:
        simulator.start()
        simulator.kick()
        step_monitor.start()
        threading.Thread(target=flush_loop, name="fleet-seen-flush", daemon=True).start()
        serving_loop.append(asyncio.get_running_loop())
        watch.start()
        if listener is not None:
            listener.start()
        if threading.current_thread() is threading.main_thread():
            # uvicorn's handler stops accepting and waits for open requests; before it, start draining, so
            # push streams (which never end by themselves) close at once and readiness turns 503.
            previous = signal.getsignal(signal.SIGTERM)

            def on_term(sig: int, frame: Any) -> None:
                log.warning("SIGTERM: draining")
                begin_drain()
                if callable(previous):
                    previous(sig, frame)

            signal.signal(signal.SIGTERM, on_term)

    def on_shutdown() -> None:
        stop.set()
        if listener is not None:
            listener.stop()
        simulator.stop()
        step_monitor.stop()
        service.flush_seen()

    # FastAPI's own OpenTelemetry hooks are off: they look the providers up on every request (a tenth of a
    # check-in's CPU in the app), and this server's metrics are Prometheus (metrics.py).
    app = FastAPI(title="edgerun fleet release server", version="1", on_startup=[on_startup],
                  on_shutdown=[on_shutdown], telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.service, app.state.engine, app.state.store = service, engine, store
    app.state.release_watch = watch
    app.state.metrics, app.state.begin_drain = metrics, begin_drain

    def require_admin(request: Request) -> str:
        token = _bearer(request)
        if not service.is_admin(token):
            raise HTTPException(403, "admin token required")
        return "admin"

    def require_device(request: Request, device_id: str) -> DeviceIdentity:
        owner = service.identity(_bearer(request))
        if owner is None or owner.device_id != device_id:
            raise HTTPException(403, "this token does not belong to that device")
        return owner

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> Response:
        # Without the offending input: a NaN or infinity in it would make the error answer itself fail (500).
        return JSONResponse({"detail": [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                                        for e in exc.errors()]}, status_code=422)

    @app.exception_handler(sa.exc.DBAPIError)
    async def database_unavailable(_request: Request, exc: sa.exc.DBAPIError) -> Response:
        # The database restarting or unreachable: a clean, retryable answer (the balancer may try another
        # replica; agents keep their reports and retry), never a traceback. A statement PostgreSQL cancelled
        # at the statement timeout (a lock held too long, an overloaded database) is answered the same way,
        # and says so: its connection goes back to the pool and the process keeps serving.
        timed_out = getattr(exc.orig, "sqlstate", None) == QUERY_CANCELED
        log.warning("database statement timed out" if timed_out else "database error",
                    extra={"error": type(exc.orig).__name__ if exc.orig else type(exc).__name__})
        return JSONResponse({"detail": STATEMENT_TIMED_OUT if timed_out else DATABASE_UNAVAILABLE}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(FleetError)
    async def fleet_error(_request: Request, exc: FleetError) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    async def identity_of(token: str) -> DeviceIdentity | None:
        """A held token at once; otherwise its database lookup runs in the thread pool, so that a device this
        process has not seen yet (every device, after a start or behind a new replica) never holds up the
        requests of the others for a database round trip."""
        found = service.cached_identity(token)
        return found if found is not None else await run_in_threadpool(service.identity, token)

    async def push_header_value(headers: dict[bytes, bytes]) -> str | None:
        """Push: any request that carries a device profile learns whether that device is out of date."""
        raw, auth = headers.get(b"x-edgerun-profile"), headers.get(b"authorization", b"")
        if not raw or not auth.lower().startswith(b"bearer "):
            return None
        try:
            profile = DeviceProfile.from_dict(Profile.model_validate_json(raw).model_dump())
        except ValueError:
            return None  # a bad profile header must not break the business request it rides on
        try:
            owner = await identity_of(auth[7:].strip().decode("latin-1"))
            if owner is None or owner.device_id != profile.device_id:
                return None
            _, table = await service.current()
            stale = service.needs_update(service.trusted_profile(profile, owner), table)
        except sa.exc.DBAPIError:
            return None  # the database away: the business request still gets its own answer (maybe a 503)
        return f"/v1/devices/{profile.device_id}/assignment" if stale else "up-to-date"

    def body_rule(scope: Scope) -> BodyRule:
        """Who may send a body to this route, and how large; judged before a byte of it is read."""
        path, method = scope["path"], scope["method"]
        if path.startswith("/v1/admin/"):
            limit = cfg.max_blob_mb * 1024 * 1024 if method == "PUT" and path.startswith("/v1/admin/blobs/") else ADMIN_BODY
            return BodyRule(limit, admin_from_headers)
        if path == "/v1/devices/register":
            return BodyRule(SMALL_BODY)
        if path.startswith("/v1/devices/"):
            device_id = path.split("/")[3]
            limit = REPORTS_BODY if path.endswith("/reports") else SMALL_BODY
            return BodyRule(limit, lambda s: device_from_headers(s, device_id))
        if path == "/v1/stream/batches":
            return BodyRule(MAX_BATCH_BYTES, lambda s: device_from_headers(s, None))
        if path.startswith("/v1/stream/large/parts/"):
            return BodyRule(MAX_PART_BODY, lambda s: device_from_headers(s, None))
        return BodyRule(SMALL_BODY)

    async def admin_from_headers(scope: Scope) -> tuple[int, str] | None:
        token = bearer(scope)
        if token is None:
            return 401, "missing bearer token"
        try:
            return None if await service.is_admin_async(token) else (403, "admin token required")
        except sa.exc.DBAPIError:
            return 503, DATABASE_UNAVAILABLE

    async def device_from_headers(scope: Scope, device_id: str | None) -> tuple[int, str] | None:
        token = bearer(scope)
        if token is None:
            return 401, "missing bearer token"
        try:
            owner = await identity_of(token)
        except sa.exc.DBAPIError:  # a token not cached while the database is away
            return 503, DATABASE_UNAVAILABLE
        if owner is None or (device_id is not None and owner.device_id != device_id):
            return 403, "this token does not belong to that device"
        scope[checkin_path.IDENTITY] = owner  # the check-in's answer needs no second look-up
        return None

    # Innermost of these: after the rate limit and the body limit, before FastAPI's router (defined below).
    app.add_middleware(checkin_path.CheckinPath, answer=lambda *a: answer_checkin(*a))
    app.add_middleware(PiggybackPush, header_value=push_header_value)
    app.add_middleware(BodyLimit, rule_for=body_rule)
    # Added last, so it runs first: a flood is refused before any token is looked up or body read.
    app.add_middleware(RateLimit, per_address=per_address, per_token=per_token,
                       on_refused=lambda scope: metrics.refused.labels(scope).inc(), clock=clock)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(DASHBOARD.read_text())

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "root_version": service.root().version}

    @app.get("/v1/ready")
    def ready() -> Response:
        """For the load balancer: 200 while this process can serve (database and store answer, not draining)."""
        problems = ["draining"] if draining.is_set() else []
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except Exception as exc:
            problems.append(f"database: {type(exc).__name__}")
        try:
            store.ready()
        except Exception as exc:
            problems.append(f"store: {exc}")
        return JSONResponse({"ready": not problems, "problems": problems}, status_code=503 if problems else 200)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/roots/{version}")
    def root_document(version: int) -> dict[str, Any]:
        doc = service.root_document(version)
        if doc is None:
            raise HTTPException(404, f"no root v{version}")
        return doc

    @app.post("/v1/devices/register")
    def register(body: RegisterRequest) -> dict[str, Any]:
        profile = DeviceProfile.from_dict(body.profile.model_dump())
        try:
            if body.device_token is not None:
                token, identity = body.device_token, service.register(body.enroll_token, profile, body.device_token)
            else:
                token, identity = service.register_with_server_token(body.enroll_token, profile)
        except EnrolmentError as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        return {"token": token, "device_id": identity.device_id, "device_groups": list(identity.device_groups)}

    up_to_date, updated = metrics.checkins.labels("up-to-date"), metrics.checkins.labels("update")

    async def answer_checkin(device_id: str, token: str | None, raw: bytes,
                             owner: DeviceIdentity | None = None) -> checkin_path.Answer:
        """Answered by hand (no model round trips), on the event loop, from cached tokens, root and releases; a
        token not held yet (`identity_of`), the periodic re-read of the root and releases (`service.current`) and
        an out-of-date device, which needs a serial and a delivery record from the database, go to worker threads. Served by `checkin_path.CheckinPath` ahead of FastAPI's router, and by the route below."""
        try:
            if owner is None and token:  # `owner`: the body limit's look-up of the same token
                owner = await identity_of(token)
            if owner is None or owner.device_id != device_id:
                return checkin_path.error(403, "this token does not belong to that device")
            try:
                body = CheckinRequest.model_validate_json(raw)
            except ValueError as exc:
                return checkin_path.error(422, f"bad profile: {exc}")
            if body.device_id != device_id:
                return checkin_path.error(400, "profile names another device")
            # The device's word for its app, OS, user groups and tasks; the admin's for its device groups.
            profile = DeviceProfile(body.device_id, body.app_version, body.os, owner.device_groups,
                                    tuple(body.user_groups), body.tasks, body.idle, body.charging)
            service.note_seen(profile)
            watch.index.checked_in(profile)
            root, table = await service.current()
            root_version = root.version
            if not service.needs_update(profile, table):
                up_to_date.inc()
                # The signed timestamp as JSON is kept with it (`timestamp_json`): one encoding per signature.
                return 200, (b'{"status": "up-to-date", "root_version": %d, "timestamp": %s}'
                             % (root_version, service.timestamp_json(device_id, body.serial, root))), []
            assignment = await run_in_threadpool(service.assignment, profile, table)
        except sa.exc.DBAPIError:
            return checkin_path.error(503, DATABASE_UNAVAILABLE, [(b"retry-after", b"1")])
        updated.inc()
        return 200, json.dumps({"status": "update", "root_version": root_version, "assignment": assignment}).encode(), []

    @app.post("/v1/devices/{device_id}/checkin", response_model=CheckinAnswer,
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": CheckinRequest.model_json_schema()}}}})
    async def checkin(device_id: str, request: Request) -> Response:
        status, payload, headers = await answer_checkin(device_id, _bearer(request), await request.body())
        return Response(payload, status, {k.decode(): v.decode() for k, v in headers}, media_type="application/json")

    @app.get("/v1/devices/{device_id}/assignment")
    def assignment(device_id: str, request: Request) -> dict[str, Any]:
        owner = require_device(request, device_id)
        return service.assignment(service.trusted_profile(service.stored_profile(device_id), owner))

    @app.get("/v1/devices/{device_id}/events")
    def events(device_id: str, request: Request) -> StreamingResponse:
        """Push-then-pull: a server-sent-event stream of "something changed" nudges (push_channel.py)."""
        owner = require_device(request, device_id)

        def load_profile() -> DeviceProfile:
            try:
                return service.trusted_profile(service.stored_profile(owner.device_id), owner)
            except FleetError:  # no stored profile yet: any release that targets it finds it out of date
                return DeviceProfile(owner.device_id, device_groups=owner.device_groups)

        return StreamingResponse(device_events(watch, owner, load_profile, metrics.open_streams),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.post("/v1/devices/{device_id}/reports")
    async def add_reports(device_id: str, body: ReportBatch, request: Request) -> dict[str, int]:
        owner = await identity_of(_bearer(request))
        if owner is None or owner.device_id != device_id:
            raise HTTPException(403, "this token does not belong to that device")
        accepted = await group_commit.submit(device_id, [r.model_dump() for r in body.reports])
        metrics.reports.labels("new").inc(accepted)
        metrics.reports.labels("duplicate").inc(len(body.reports) - accepted)
        return {"accepted": accepted}

    @app.get("/v1/blobs/{digest}")
    async def get_blob(digest: str, request: Request) -> Response:
        """On the event loop for a small blob already held (`SmallBlobs`); everything else (the first read, a
        range, a large blob, a remote store) in a worker thread."""
        token = _bearer(request)
        if not (await service.is_admin_async(token) or await identity_of(token)):
            raise HTTPException(403, "unknown token")
        digest = check_digest(digest)
        blob_downloads[digest] = blob_downloads.get(digest, 0) + 1
        if request.headers.get("range") is None:
            data = small_blobs.get(digest)
            if data is None:
                data = await run_in_threadpool(small_blobs.load, store, digest)
            if data is not None:
                return small_blob_response(data)
        return await run_in_threadpool(blob_response, store, digest, request.headers.get("range"))

    @app.get("/v1/admin/blob-downloads", dependencies=[Depends(require_admin)])
    def blob_download_counts() -> dict[str, int]:
        """How often this process served each blob: shared files must be fetched once per device."""
        return dict(blob_downloads)

    app.include_router(build_admin_router(engine, service, store, simulator.kick, require_admin))
    # The cloud end of the stream tunnel (edgerun.stream.cloud) lives in this server at /v1/stream.
    app.include_router(stream_router(service, engine, service.is_admin), prefix="/v1/stream")
    return app
