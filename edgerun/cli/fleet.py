"""`edgerun fleet …` (release server, device agent, keys, releases) and `edgerun task …` (pack, publish)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from edgerun.cli import federated as federated_cli
from edgerun.secret_files import secret_from

TOKEN_ENV = "EDGERUN_FLEET_TOKEN"
ENROLL_ENV = "EDGERUN_ENROLL_TOKEN"


def _print(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _csv(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


def _rate(text: str) -> str:
    from edgerun.fleet.rate_limit import Rate

    try:
        Rate.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from edgerun.fleet import json_logs
    from edgerun.fleet.asgi import ENV, config_to_env
    from edgerun.fleet.server import ServerConfig, create_app, prepare

    cfg = prepare(ServerConfig(data_dir=Path(args.data), keys_dir=Path(args.keys), db_url=args.db or "",
                               store=args.store or "", admin_token=secret_from(args.admin_token_file, TOKEN_ENV),
                               enroll_token=secret_from(args.enroll_token_file, ENROLL_ENV),
                               s3_endpoint_url=args.s3_endpoint_url or "",
                               s3_region=args.s3_region or "", s3_access_key_id=args.s3_access_key_id or "",
                               monitor_interval_s=args.monitor_interval, timestamp_ttl_s=args.timestamp_ttl,
                               max_blob_mb=args.max_blob_mb, enroll_token_uses=args.enroll_token_uses,
                               db_pool_size=args.db_pool_size, db_max_overflow=args.db_max_overflow,
                               db_statement_timeout_ms=args.db_statement_timeout_ms,
                               identity_cache_size=args.identity_cache_size, seen_resolution_s=args.seen_resolution,
                               rate_per_token=args.rate_per_token, rate_per_address=args.rate_per_address,
                               push_poll_s=args.push_poll))
    json_logs.configure(args.log_level, args.log_format)
    # Behind a load balancer on another host, name it here so the rate limit per address sees the client.
    proxy = {"proxy_headers": True, "forwarded_allow_ips": args.forwarded_allow_ips}
    # A stop (SIGTERM) ends push streams at once and waits up to --drain-timeout for open requests.
    common = {"host": args.host, "port": args.port, "log_level": args.log_level, "access_log": False,
              "log_config": None, "timeout_graceful_shutdown": args.drain_timeout, **proxy}
    def where(path: str | None, env: str, name: str) -> str:
        return path or (f"${env}" if os.environ.get(env) else str(cfg.data_dir / name))

    print(f"edgerun fleet server on http://{args.host}:{args.port}/  (admin token in "
          f"{where(args.admin_token_file, TOKEN_ENV, 'admin_token')}, enrolment token in "
          f"{where(args.enroll_token_file, ENROLL_ENV, 'enroll_token')})", flush=True)
    if args.workers > 1:
        os.environ[ENV] = config_to_env(cfg)
        uvicorn.run("edgerun.fleet.asgi:app_from_env", factory=True, workers=args.workers, **common)
    else:
        app = create_app(cfg)
        begin_drain = app.state.begin_drain

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                # Ctrl-C or SIGTERM: drain first (readiness 503, open push streams end), so the graceful stop
                # finds no response that never ends and has nothing to cancel (no CancelledError tracebacks).
                begin_drain()
                super().handle_exit(sig, frame)

        # Requests still open after --drain-timeout are closed by uvicorn: the stop never hangs.
        try:
            Server(uvicorn.Config(app, **common)).run()
        finally:  # uvicorn re-raises the Ctrl-C once stopped: the command then exits 130, as a shell expects
            print("edgerun fleet server stopped", flush=True)
    return 0


def _agent_logging(quiet: bool, verbose: bool) -> None:
    """One line per thing the agent does (install, removal, run, reports sent, refusals) on stderr;
    --quiet keeps warnings only, --verbose adds each check-in and the HTTP requests."""
    import logging

    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore"):  # a line per request: only with --verbose
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def cmd_agent(args: argparse.Namespace) -> int:
    from edgerun.fleet.agent import Agent

    _agent_logging(args.quiet, args.verbose)
    enroll_token = secret_from(args.enroll_token_file, ENROLL_ENV) or None
    agent = Agent(args.server, args.device_id, args.state, root_path=args.root, enroll_token=enroll_token,
                  app_version=args.app_version, os_name=args.os, device_groups=tuple(args.device_group),
                  user_groups=tuple(args.user_group), checkin_interval_s=args.interval,
                  warm_workers=args.warm, max_concurrent_runs=args.max_concurrent_runs)
    hooks = None
    if not args.no_stream:
        from edgerun.stream.agent_hooks import StreamHooks

        # Tasks with `triggers` run when their events occur; outputs go to the server's /v1/stream.
        # A ready output goes to the cloud at once; the tasks one event matched run side by side when warm.
        hooks = StreamHooks.for_agent(agent, realtime=True,
                                      max_concurrent_runs=args.max_concurrent_runs if args.warm else 1)
        agent.hooks = hooks
    try:
        if args.once:
            agent.step()
            for e in agent.errors:
                print(f"agent {args.device_id}: {e}", file=sys.stderr)
            _print({"device": args.device_id, "tasks": agent.profile().tasks, "errors": agent.errors})
            return 1 if agent.errors else 0
        # SIGTERM (systemd, a phone's OS) stops the loop: runs in progress end as `cancelled` and are
        # reported, instead of counting as interrupted (two in a row quarantine a version).
        import signal
        import threading

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        agent.run_forever(stop, push=not args.no_push, fallback_checkin_s=args.fallback_interval)
    finally:
        if hooks is not None:
            hooks.close()
        agent.close()
    return 0


def cmd_keys_init(args: argparse.Namespace) -> int:
    from edgerun.fleet.signing import KeyDir

    root = KeyDir(args.keys).init()
    print(f"keys and root v{root['signed']['version']} written to {args.keys}; keep root.key and release.key offline")
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    from edgerun.fleet.signing import KeyDir

    keys = KeyDir(args.keys)
    root = keys.rotate(args.role)
    print(f"rotated the {args.role} key; root is now v{root['signed']['version']}")
    if args.server:
        print(f"server accepted root v{_admin(args).push_roots(keys)}")
    return 0


def _admin(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from edgerun.fleet.admin_client import AdminClient

    return AdminClient(args.server, secret_from(args.token_file, TOKEN_ENV))


def cmd_release(args: argparse.Namespace) -> int:
    client = _admin(args)
    if args.action == "list":
        rows = client.releases()
        for r in rows:
            print(f"#{r['id']:<4} {r['task']:<20} v{r['version']:<5} {r['stage']:<12} {r['exposure_percent']:>5}%  "
                  f"ok={r['total_success']} fail={r['total_failure']} {'PAUSED ' if r['paused'] else ''}{r['reason']}")
        return 0
    if args.id is None:
        raise SystemExit(f"edgerun fleet release {args.action}: needs a release id")
    if args.action == "show":
        _print(client.release(args.id))
    elif args.action == "audit":
        _print(client.audit(args.id))
    else:
        _print(client.control(args.id, args.action))
    return 0


def cmd_device(args: argparse.Namespace) -> int:
    client = _admin(args)
    if args.action == "enrol-token":
        print(client.enrolment_token(args.device_id, tuple(args.group), args.uses, args.ttl))
        return 0
    if args.device_id is None:
        raise SystemExit(f"edgerun fleet device {args.action}: needs a device id")
    _print(client.set_device_groups(args.device_id, tuple(args.group)) if args.action == "groups"
           else client.revoke_device(args.device_id))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from edgerun.fleet.package import pack_task

    package = pack_task(args.dir, args.output)
    print(f"packed {package.name} v{package.version}: {len(package.files)} file(s) → {args.output}")
    if not package.config.get("schedule") and not package.config.get("triggers"):
        # Such a task is installed but runs only when the agent's host application calls it, so a release
        # of it gathers no reports by itself and waits at its first step: say so before it is published.
        print(f"note: {package.name} has no schedule and no triggers: agents install it but run it only when "
              f"their application calls it (Agent.run_task), so its release gets no reports until then")
    return 0


def cmd_task_run(args: argparse.Namespace) -> int:
    from edgerun.fleet.container import Limits, run_in_container
    from edgerun.fleet.errors import FleetError
    from edgerun.fleet.package import CONFIG_NAME
    from edgerun.fleet.task_schema import parse_config_json, validate_task_config

    folder = Path(args.dir)
    if not (folder / CONFIG_NAME).is_file():
        raise FleetError(f"{folder} has no {CONFIG_NAME}")
    config = validate_task_config(parse_config_json((folder / CONFIG_NAME).read_bytes(), str(folder / CONFIG_NAME)))
    inputs = parse_config_json(args.inputs, "--inputs") if args.inputs else {}
    result = run_in_container(folder, config["entry"], inputs, limits=Limits.from_config(config["limits"]),
                              network=config["network"])
    record = {"outcome": result.outcome, "output": result.output, "error": result.error,
              "latency_ms": round(result.latency_ms, 1), **result.extra}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    _print(record)
    return 0 if result.ok else 1


def cmd_publish(args: argparse.Namespace) -> int:
    from edgerun.fleet.signing import KeyDir

    policy: dict[str, Any] = {}
    if args.steps:
        policy["steps"] = [float(s) for s in _csv(args.steps)]
    for name in ("min_reports", "error_min_reports", "success_threshold", "error_threshold", "active_window_s"):
        if getattr(args, name) is not None:
            policy[name] = getattr(args, name)
    if args.beta:
        policy["beta_devices"] = _csv(args.beta)
    if args.simulate is not None:
        policy["simulation_agents"] = args.simulate
    release = _admin(args).publish(args.package, KeyDir(args.keys), policy)
    print(f"published {release['task']} v{release['version']} as release #{release['id']} (stage {release['stage']})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.name == "federated":
        from edgerun.cli.federated import cmd_demo as federated_demo

        return federated_demo(args)
    from edgerun.fleet.walle_demo import run_demo

    return run_demo(2 if args.devices is None else args.devices, args.events, Path(args.keep) if args.keep else None)


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=os.environ.get("EDGERUN_FLEET_SERVER", "http://127.0.0.1:8700"))
    p.add_argument("--token-file", help=f"file holding the admin token, mode 600 (default: ${TOKEN_ENV})")


def register(subparsers: argparse._SubParsersAction) -> None:
    # allow_abbrev=False where a token flag is: `--token SECRET` must fail, not pass as `--token-file SECRET`.
    fleet = subparsers.add_parser("fleet", help="fleet release server, device agent, keys and releases")
    fsub = fleet.add_subparsers(dest="fleet_command", metavar="SUBCOMMAND", required=True)

    p = fsub.add_parser("serve", allow_abbrev=False, help="run the release server (HTTP API, dashboard at /)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--data", required=True, help="folder for the SQLite database and the file store")
    p.add_argument("--keys", required=True, help="key folder: the root chain and assignment.key are read")
    p.add_argument("--db", help="SQLAlchemy URL, e.g. postgresql://user@host/db (default: DATA/fleet.db)")
    p.add_argument("--store", help="blob store: a folder or s3://bucket/prefix (default: DATA/blobs)")
    p.add_argument("--s3-endpoint-url", help="S3-compatible endpoint for an s3:// store (default: $AWS_ENDPOINT_URL)")
    p.add_argument("--s3-region", help="S3 region (default: $AWS_DEFAULT_REGION, else us-east-1)")
    p.add_argument("--s3-access-key-id", help="S3 access key id (default: $AWS_ACCESS_KEY_ID or ~/.aws); the secret "
                                              "key is never an argument: $AWS_SECRET_ACCESS_KEY or ~/.aws")
    p.add_argument("--monitor-interval", type=float, default=1.0,
                   help="seconds between re-evaluations of rollout steps against the live device count")
    p.add_argument("--admin-token-file",
                   help=f"file holding the admin token, mode 600 (default: ${TOKEN_ENV}, else DATA/admin_token)")
    p.add_argument("--enroll-token-file",
                   help="file holding the server's own enrolment token (new device ids only, no groups), mode 600 "
                        f"(default: ${ENROLL_ENV}, else DATA/enroll_token)")
    p.add_argument("--timestamp-ttl", type=float, default=600.0,
                   help="seconds a signed 'up to date' answer stays valid (TUF's timestamp role)")
    p.add_argument("--max-blob-mb", type=int, default=1024, help="largest file an admin may upload")
    p.add_argument("--enroll-token-uses", type=int, default=0,
                   help="how many new devices the server's own enrolment token may enrol in all (0: any)")
    p.add_argument("--workers", type=int, default=1, help="server processes sharing the database and store")
    p.add_argument("--db-pool-size", type=int, default=10,
                   help="PostgreSQL connections kept per server process (replicas × workers × this < max_connections)")
    p.add_argument("--db-max-overflow", type=int, default=20, help="connections opened beyond the pool under bursts")
    p.add_argument("--db-statement-timeout-ms", type=int, default=30_000,
                   help="PostgreSQL cancels a statement (lock waits included) running past this; 0: never")
    p.add_argument("--identity-cache-size", type=int, default=100_000,
                   help="device tokens whose identity each process keeps for 10 s (least recently used out)")
    p.add_argument("--seen-resolution", type=float, default=300.0,
                   help="seconds a device's stored last-seen time may lag its check-ins (fewer database writes); "
                        "never more than a quarter of a running step's liveness window")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--log-format", choices=("json", "text"), default="json",
                   help="server logs on stderr: one JSON object a line (default) or plain text")
    p.add_argument("--rate-per-token", type=_rate, default="20/s:200",
                   help="requests each bearer token may make: N/s:BURST, or 0 for no limit")
    p.add_argument("--rate-per-address", type=_rate, default="1000/s:5000",
                   help="requests each client address may make (many phones share a carrier's address): N/s:BURST or 0")
    p.add_argument("--push-poll", type=float, default=0.0,
                   help="seconds between the push watch's looks at the release table (0: 0.5 on SQLite; 5 on "
                        "PostgreSQL, where NOTIFY tells every replica of a change at once)")
    p.add_argument("--drain-timeout", type=float, default=10.0,
                   help="on SIGTERM: seconds to let open requests finish (push streams end at once)")
    p.add_argument("--forwarded-allow-ips", default="127.0.0.1",
                   help="load balancers whose X-Forwarded-For names the client (comma-separated addresses)")
    p.set_defaults(func=cmd_serve)

    p = fsub.add_parser("agent", allow_abbrev=False, help="run a device agent")
    p.add_argument("--server", required=True)
    p.add_argument("--device-id", required=True)
    p.add_argument("--state", required=True, help="folder for the agent's SQLite state and task files")
    p.add_argument("--root", help="trusted root document (needed on first start)")
    p.add_argument("--enroll-token-file",
                   help=f"file holding an enrolment token, mode 600, needed on first start (or ${ENROLL_ENV})")
    p.add_argument("--app-version", default="1.0")
    p.add_argument("--os", default=sys.platform)
    p.add_argument("--device-group", action="append", default=[])
    p.add_argument("--user-group", action="append", default=[])
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between rounds (scheduled runs, stream, reports; check-ins with --no-push)")
    p.add_argument("--no-push", action="store_true", help="poll every round instead of the server's event stream")
    p.add_argument("--fallback-interval", type=float, default=300.0,
                   help="with push: seconds between check-ins when no nudge came (the fallback poll)")
    p.add_argument("--warm", action="store_true", help="pre-started isolated workers per task version")
    p.add_argument("--max-concurrent-runs", type=int, default=4, help="with --warm: runs at once, all tasks")
    p.add_argument("--once", action="store_true", help="one round (check in, run due tasks, report), then exit")
    p.add_argument("--no-stream", action="store_true", help="do not run the on-device stream pipeline")
    loudness = p.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", action="store_true", help="log warnings only (refusals, failed check-ins)")
    loudness.add_argument("--verbose", action="store_true", help="also log every check-in and HTTP request")
    p.set_defaults(func=cmd_agent)

    p = fsub.add_parser("demo", help="on loopback: walle (page events → trigger → IPV features → DIN in a task → "
                                     "real-time tunnel → the cloud store) or federated (digits learnt by N agents)")
    p.add_argument("name", choices=("walle", "federated"))
    p.add_argument("--devices", type=int, default=None, help="device agents (walle: 2, federated: 8)")
    p.add_argument("--events", type=int, default=200, help="page events per device (whole item page visits)")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (server log, keys, device state)")
    federated_cli.register_demo(p)
    p.set_defaults(func=cmd_demo)
    federated_cli.register(fsub)

    keys = fsub.add_parser("keys", help="signing keys and the root of trust")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    p = ksub.add_parser("init", help="generate root, release and assignment keys and root v1")
    p.add_argument("--keys", required=True)
    p.set_defaults(func=cmd_keys_init)
    p = ksub.add_parser("rotate", allow_abbrev=False,
                        help="replace one role's key and sign the next root version")
    p.add_argument("--keys", required=True)
    p.add_argument("--role", required=True, choices=("root", "release", "assignment"))
    p.add_argument("--server", help="also push the new root to this server")
    p.add_argument("--token-file", help=f"file holding the admin token, mode 600 (default: ${TOKEN_ENV})")
    p.set_defaults(func=cmd_keys_rotate)

    p = fsub.add_parser("release", allow_abbrev=False,
                        help="list, show, pause, resume, abort releases; show the audit log")
    p.add_argument("action", choices=("list", "show", "pause", "resume", "abort", "audit"))
    p.add_argument("id", type=int, nargs="?")
    _server_args(p)
    p.set_defaults(func=cmd_release)

    p = fsub.add_parser("device", allow_abbrev=False,
                        help="enrolment tokens, device groups (hardware class), revoking a device")
    p.add_argument("action", choices=("enrol-token", "groups", "revoke"))
    p.add_argument("device_id", nargs="?", help="enrol-token: only this id may use it; groups/revoke: the device")
    p.add_argument("--group", action="append", default=[], help="device group the admin vouches for (repeat)")
    p.add_argument("--uses", type=int, default=1, help="enrol-token: how many new devices may use it")
    p.add_argument("--ttl", type=float, default=86400.0, help="enrol-token: lifetime in seconds")
    _server_args(p)
    p.set_defaults(func=cmd_device)

    task = subparsers.add_parser("task", help="pack and publish ML task packages")
    tsub = task.add_subparsers(dest="task_command", metavar="SUBCOMMAND", required=True)
    p = tsub.add_parser("pack", help="pack a task folder (task.json + scripts + resources)")
    p.add_argument("dir")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_pack)
    p = tsub.add_parser("run", help="run a task folder once in the device's compute container")
    p.add_argument("dir")
    p.add_argument("--inputs", help="JSON given to run(inputs) (default {})")
    p.add_argument("--json", help="also write the result (outcome, output, error, isolation, ...) to this file")
    p.set_defaults(func=cmd_task_run)
    p = tsub.add_parser("publish", allow_abbrev=False,
                        help="sign a package with the offline release key and start its rollout")
    p.add_argument("package")
    p.add_argument("--keys", required=True, help="key folder holding release.key and the root chain")
    _server_args(p)
    p.add_argument("--steps", help="gray steps in percent, e.g. 1,5,20,50,100")
    p.add_argument("--min-reports", type=int)
    p.add_argument("--error-min-reports", type=int)
    p.add_argument("--success-threshold", type=float)
    p.add_argument("--error-threshold", type=float)
    p.add_argument("--liveness-window", type=float, dest="active_window_s",
                   help="seconds since its last check-in after which a device no longer counts toward a step "
                        "(default 86400)")
    p.add_argument("--beta", help="comma-separated beta device ids")
    p.add_argument("--simulate", type=int, help="simulated agents in the cloud simulation stage (0 skips it)")
    p.set_defaults(func=cmd_publish)
