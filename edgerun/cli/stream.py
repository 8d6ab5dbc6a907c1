"""`edgerun stream ...`: emit events into a device's queue, inspect its pipeline, run the IPV demo or a
standalone cloud end. The design is in docs/stream.md."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgerun.errors import EdgerunError


def _print(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")


def _state_dir(args: argparse.Namespace) -> Path:
    from edgerun.stream.agent_hooks import STREAM_STATE_DIR

    if args.agent_state:
        return Path(args.agent_state) / STREAM_STATE_DIR
    if args.state_dir:
        return Path(args.state_dir)
    raise EdgerunError("give --agent-state (the agent's --state folder) or --state-dir (the pipeline's folder)")


def cmd_emit(args: argparse.Namespace) -> int:
    from edgerun.stream.event_queue import EventEmitter

    try:
        contents = json.loads(args.contents) if args.contents else None
    except ValueError as exc:
        raise EdgerunError(f"--contents is not JSON: {exc}") from exc
    if contents is not None and not isinstance(contents, dict):
        raise EdgerunError("--contents must be a JSON object")
    emitter = EventEmitter(_state_dir(args))
    try:
        event = emitter.emit(args.kind, args.page, event_id=args.event_id, time_ms=args.time_ms, contents=contents)
    finally:
        emitter.close()
    _print(event.to_dict())
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from edgerun.stream.event_queue import EventQueue
    from edgerun.stream.pipeline import OUTPUTS_FILE
    from edgerun.stream.storage import CollectiveStore

    state = _state_dir(args)
    if not state.exists():
        raise EdgerunError(f"no stream state in {state}")
    queue, store = EventQueue(state), CollectiveStore(state / OUTPUTS_FILE)
    try:
        _print({"queue": queue.stats(), "outputs": store.counters()})
    finally:
        queue.close()
        store.close()
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from edgerun.stream.pipeline import OUTPUTS_FILE
    from edgerun.stream.storage import CollectiveStore

    store = CollectiveStore(_state_dir(args) / OUTPUTS_FILE)
    try:
        _print([r.to_wire() for r in store.read(args.task, limit=args.limit)])
    finally:
        store.close()
    return 0


def cmd_ipv_demo(args: argparse.Namespace) -> int:
    from edgerun.stream.event_queue import EventEmitter
    from edgerun.stream.ipv import IPV_TRIGGER, ITEM_PAGE, generate_session, ipv_feature
    from edgerun.stream.pipeline import DevicePipeline

    events = generate_session(random.Random(args.seed), 1_700_000_000_000, args.visits)
    with tempfile.TemporaryDirectory(prefix="edgerun-ipv-") as tmp:
        pipeline = DevicePipeline(Path(tmp))
        pipeline.register_task("ipv", [IPV_TRIGGER], lambda match: ipv_feature(match.events))
        EventEmitter(Path(tmp)).emit_events(events)
        start = time.perf_counter()
        pipeline.pump(len(events))
        elapsed_ms = (time.perf_counter() - start) * 1000
        features = [r.payload for r in pipeline.store.read("ipv", limit=10**6)]
        pipeline.close()
    raw = sum(len(e.to_json()) for e in events if e.page_id == ITEM_PAGE)
    feature_bytes = sum(len(json.dumps(f, separators=(",", ":"))) for f in features)
    _print({"visits": args.visits, "features": len(features), "raw_event_bytes_per_visit": raw // max(1, len(features)),
            "feature_bytes_per_visit": feature_bytes // max(1, len(features)),
            "reduction": round(1 - feature_bytes / raw, 4), "pipeline_ms_per_visit": round(elapsed_ms / args.visits, 3),
            "example": features[0] if features else None})
    return 0


def cmd_cloud(args: argparse.Namespace) -> int:
    import uvicorn

    from edgerun.stream.cloud_app import create_app, tokens_from_args

    devices, admin = tokens_from_args(args)
    print(f"edgerun stream cloud end on http://{args.host}:{args.port}/v1/stream", flush=True)
    uvicorn.run(create_app(args.db, devices, admin), host=args.host, port=args.port, log_level="warning")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    stream = subparsers.add_parser("stream", help="on-device stream pipeline: events, triggers, outputs, tunnel")
    ssub = stream.add_subparsers(dest="stream_command", metavar="SUBCOMMAND", required=True)

    def add_state(p: argparse.ArgumentParser) -> None:
        p.add_argument("--agent-state", help="the device agent's --state folder (its pipeline is in STATE/stream)")
        p.add_argument("--state-dir", help="the pipeline's own folder (events.db, outputs.db)")

    p = ssub.add_parser("emit", help="append an app event to the device's durable event queue")
    add_state(p)
    p.add_argument("--kind", required=True, choices=["page_enter", "page_exit", "click", "scroll", "exposure"])
    p.add_argument("--page", required=True, help="page id")
    p.add_argument("--event-id", help="event id (default: the kind)")
    p.add_argument("--time-ms", type=int, help="event time (default: now)")
    p.add_argument("--contents", help="JSON object")
    p.set_defaults(func=cmd_emit)

    p = ssub.add_parser("stats", help="queue and output counters (drops, uploads, recoveries)")
    add_state(p)
    p.set_defaults(func=cmd_stats)

    p = ssub.add_parser("read", help="print stored task outputs")
    add_state(p)
    p.add_argument("--task", help="only this task's outputs")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=cmd_read)

    p = ssub.add_parser("ipv-demo", help="the paper's IPV feature on synthetic events, on this machine")
    p.add_argument("--visits", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(func=cmd_ipv_demo)

    p = ssub.add_parser("cloud", allow_abbrev=False,
                        help="run a standalone cloud end (the fleet server mounts the same routes)")
    p.add_argument("--db", required=True, help="SQLAlchemy URL, e.g. sqlite:////tmp/stream-cloud.db")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8780)
    # Token files, never values (argv shows in `ps`); the same options as `python -m edgerun.stream.cloud_app`,
    # not imported from it: that would load FastAPI on every `edgerun` start.
    p.add_argument("--device-tokens-file", metavar="FILE",
                   help="file of DEVICE=TOKEN lines, mode 600: accept these devices (turns authentication on)")
    p.add_argument("--admin-token-file", metavar="FILE",
                   help="file holding the token that may read every record, mode 600 "
                        "(default: $EDGERUN_STREAM_ADMIN_TOKEN)")
    p.set_defaults(func=cmd_cloud)
