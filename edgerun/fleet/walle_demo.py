"""Walle's own use case end to end, on loopback: page events from the app → the trigger trie (an item
page's exit) → IPV features → the zoo's DIN, an edgerun program inside a task, in a warm isolated worker →
its score through the real-time tunnel → the server's cloud store. `edgerun fleet demo walle` runs it and
tests/fleet/test_fleet_walle_usecase.py checks it, with these same steps."""

from __future__ import annotations

import json
import random
import secrets
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from edgerun.fleet.admin_client import AdminClient
from edgerun.fleet.agent import Agent
from edgerun.fleet.errors import FleetError
from edgerun.fleet.local_server import FleetServer, start_server
from edgerun.fleet.package import pack_task
from edgerun.fleet.signing import KeyDir
from edgerun.stream.agent_hooks import STREAM_STATE_DIR, RunFn, StreamHooks
from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.events import Event, EventKind
from edgerun.stream.ipv import IPV_TRIGGER, ITEM_PAGE, generate_session, ipv_feature
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.uploader import Backoff

TASK_ID = "ipv-rank"

# IPV features of the visit the trigger captured, turned into DIN's inputs: the items exposed on the page
# as the history, the visited item as the target. Shared by the task and the direct check, so both score
# the same inputs.
DIN_INPUTS = """\
import numpy as np

ITEMS, CATEGORIES, LENGTH = 5000, 200, 20

def din_inputs(feature):
    history = [i % (ITEMS - 1) + 1 for i in feature["exposed_items"]][:LENGTH]
    items = np.zeros((1, LENGTH), np.int64)
    items[0, :len(history)] = history
    cats = np.where(items > 0, items % (CATEGORIES - 1) + 1, 0)
    target = np.array([feature["item_id"] % (ITEMS - 1) + 1], np.int64)
    return [items, cats, target, target % (CATEGORIES - 1) + 1]
"""

# The task: scored by the model its package carries.
RANK_TASK = DIN_INPUTS + """
import os
import edgerun
from edgerun.stream.events import Event
from edgerun.stream.ipv import ipv_feature

MODEL = edgerun.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "din.edgerun"))

def run(inputs):
    feature = ipv_feature([Event.from_dict(e) for e in inputs["events"]])
    score = float(np.asarray(MODEL(*din_inputs(feature))).reshape(-1)[0])
    return {"item_id": feature["item_id"], "dwell_ms": feature["dwell_ms"], "score": score}
"""


def export_din(path: Path) -> Path:
    """The zoo's DIN exported to an edgerun program file."""
    import edgerun
    import edgerun.zoo

    zoo = edgerun.zoo.get("din")
    with warnings.catch_warnings():  # torch.export's own deprecation notices say nothing about the demo
        warnings.simplefilter("ignore", FutureWarning)
        edgerun.export(zoo.build(), zoo.example_inputs()).save(path)
    return path


def pack_rank_task(work: Path, program: Path) -> Path:
    """The task folder (trigger spec, entry, the DIN program under models/) packed into one package."""
    src = work / f"{TASK_ID}-src"
    (src / "models").mkdir(parents=True, exist_ok=True)
    config = {"name": TASK_ID, "version": 1, "entry": "main.py", "triggers": [IPV_TRIGGER],
              "limits": {"timeout_s": 30}}
    (src / "task.json").write_text(json.dumps(config))
    (src / "main.py").write_text(RANK_TASK)
    shutil.copyfile(program, src / "models" / "din.edgerun")
    package = work / f"{TASK_ID}-v1.tar"
    pack_task(src, package)
    return package


def publish_rank_task(admin: AdminClient, package: Path, keys: KeyDir) -> dict[str, Any]:
    """Straight to every device: a demo fleet is too small for gray steps."""
    return admin.publish(package, keys, {"steps": [100], "min_reports": 100})


class TimedHooks(StreamHooks):
    """The agent's stream hooks, noting when each trigger fired (wall clock, as the server's received_ms),
    keyed by the visited item, and how many runs returned a score."""

    def __init__(self, pipeline: DevicePipeline) -> None:
        super().__init__(pipeline)
        self.fired_ms: dict[Any, float] = {}
        self.runs = 0

    def on_task_activated(self, task_id: str, config: dict[str, Any], run_fn: RunFn) -> None:
        def timed(inputs: Any) -> Any:
            self.fired_ms[inputs["events"][-1]["contents"].get("item_id")] = time.time() * 1000
            result = run_fn(inputs)
            self.runs += bool(result.ok)
            return result

        super().on_task_activated(task_id, config, timed)

    @classmethod
    def attach(cls, agent: Agent) -> TimedHooks:
        """Real-time uploads with a short retry backoff, hooked into the agent."""
        hooks = cls.for_agent(agent, backoff=Backoff(base_s=0.01, cap_s=0.1), realtime=True)
        assert isinstance(hooks, TimedHooks)
        agent.hooks = hooks
        return hooks


def session_events(seed: int, at_least: int) -> list[Event]:
    """Synthetic page events of one user: whole item page visits until there are `at_least` events."""
    rng = random.Random(seed)
    events: list[Event] = []
    start = 1_700_000_000_000
    while len(events) < max(1, at_least):
        events += generate_session(rng, events[-1].time_ms if events else start, visits=1)
    return events


def feed(agent: Agent, events: list[Event]) -> None:
    """What the app does: append its events to the device's durable queue."""
    app = EventEmitter(agent.state_dir / STREAM_STATE_DIR)
    try:
        for e in events:
            app.emit(e.kind.value, e.page_id, time_ms=e.time_ms, event_id=e.event_id, contents=e.contents)
    finally:
        app.close()


def stored_records(server_url: str, token: str, device_id: str) -> list[dict[str, Any]]:
    """The rank task's records in the server's cloud store, read with the device's own token."""
    response = httpx.get(f"{server_url}/v1/stream/records", params={"device_id": device_id},
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)
    response.raise_for_status()
    return [r for r in response.json() if r["task_id"] == TASK_ID]


def item_visits(events: list[Event]) -> list[list[Event]]:
    """The item page visits: each one's enter, everything on the item page, its exit."""
    visits: list[list[Event]] = []
    for e in events:
        if e.page_id == ITEM_PAGE and e.kind is EventKind.PAGE_ENTER:
            visits.append([])
        if e.page_id == ITEM_PAGE:
            visits[-1].append(e)
    return visits


def direct_scores(events: list[Event], program: Path) -> list[dict[str, Any]]:
    """The same features scored here by the same program, outside the fleet: what the cloud must hold."""
    import edgerun

    namespace: dict[str, Any] = {}
    exec(compile(DIN_INPUTS, "din_inputs", "exec"), namespace)
    model = edgerun.load(program)
    scores = []
    for visit in item_visits(events):
        feature = ipv_feature(visit)
        score = float(np.asarray(model(*namespace["din_inputs"](feature))).reshape(-1)[0])
        scores.append({"item_id": feature["item_id"], "dwell_ms": feature["dwell_ms"], "score": score})
    return scores


@dataclass
class DemoDevice:
    agent: Agent
    hooks: TimedHooks
    events: list[Event]


def run_demo(devices: int = 2, events: int = 200, work: Path | None = None,
             out: Callable[[str], None] = print, timeout_s: float = 60.0) -> int:
    """The whole use case on loopback; prints a table and returns 0 when every stored score equals the
    direct one. Everything lives under `work` (a temporary folder, removed, when None)."""
    if devices < 1 or events < 1:
        raise FleetError("--devices and --events must be at least 1")
    keep = work is not None
    if work is not None and Path(work).exists() and any(Path(work).iterdir()):
        raise FleetError(f"--keep {work}: give a new or empty folder (the demo makes its own keys and server)")
    base = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="edgerun-walle-"))
    base.mkdir(parents=True, exist_ok=True)
    keys = KeyDir(base / "keys")
    keys.init()
    server: FleetServer | None = None
    fleet: list[DemoDevice] = []
    admin: AdminClient | None = None
    try:
        server = start_server(base, keys, admin_token=secrets.token_urlsafe(24),
                              enroll_token=secrets.token_urlsafe(24))
        out(f"fleet server on {server.url} (tokens in 0600 files under {base})")
        program = export_din(base / "din.edgerun")
        admin = server.admin()
        release = publish_rank_task(admin, pack_rank_task(base, program), keys)
        out(f"published {TASK_ID} v1 (release #{release['id']}) carrying DIN, trigger: item page exit")
        for i in range(devices):
            agent = server.agent(f"walle-{i}", base / f"device-{i}", warm_workers=True)
            hooks = TimedHooks.attach(agent)
            agent.step()  # install and announce: the trie knows the trigger, a warm worker loads the model
            if hooks.pipeline.trie.task_ids != [TASK_ID]:
                raise FleetError(f"device walle-{i} did not activate {TASK_ID}: {agent.errors}")
            fleet.append(DemoDevice(agent, hooks, session_events(18 + i, events)))
        for d in fleet:
            feed(d.agent, d.events)
            d.hooks.pipeline.pump()  # match → run → store → send at once (real time)
        want = sum(len(item_visits(d.events)) for d in fleet)
        stored = _wait_stored(server.url, fleet, want, timeout_s)
        return _report(fleet, stored, program, out)
    finally:
        for d in fleet:
            d.hooks.close()
            d.agent.close()
        if admin is not None:
            admin.close()
        if server is not None:
            server.stop()
        if keep:
            out(f"kept in {base}: server log, keys, the task package, each device's state")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _wait_stored(url: str, fleet: list[DemoDevice], want: int, timeout_s: float) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout_s
    while True:
        stored = {d.agent.device_id: stored_records(url, d.agent.token, d.agent.device_id) for d in fleet}
        if sum(map(len, stored.values())) >= want or time.monotonic() > deadline:
            return stored
        for d in fleet:
            d.hooks.poll()  # retries an upload that failed or was held back by the backoff
        time.sleep(0.05)


def _report(fleet: list[DemoDevice], stored: dict[str, list[dict[str, Any]]], program: Path,
            out: Callable[[str], None]) -> int:
    latencies, rows, mismatches = [], [], 0
    for d in fleet:
        direct = {s["item_id"]: s for s in direct_scores(d.events, program)}
        for record in stored[d.agent.device_id]:
            payload = record["payload"]
            fired = d.hooks.fired_ms.get(payload["item_id"])
            if fired is not None:
                latencies.append(record["received_ms"] - fired)
            expect = direct.get(payload["item_id"])
            same = expect is not None and expect["dwell_ms"] == payload["dwell_ms"] and \
                abs(expect["score"] - payload["score"]) <= 1e-6 * max(abs(expect["score"]), 1e-12)
            mismatches += not same
            rows.append((d.agent.device_id, payload, expect))
    counters = [d.hooks.pipeline.counters() for d in fleet]
    n_stored = len(rows)
    want = sum(len(item_visits(d.events)) for d in fleet)
    out("")
    out(f"  {'events sent':<28}{sum(len(d.events) for d in fleet):>10}")
    out(f"  {'triggers fired':<28}{sum(c['matches'] for c in counters):>10}")
    out(f"  {'runs (warm, isolated)':<28}{sum(d.hooks.runs for d in fleet):>10}")
    out(f"  {'uploads (records acked)':<28}{sum(c['uploaded'] for c in counters):>10}")
    out(f"  {'stored in the cloud':<28}{n_stored:>10}   (item page visits: {want})")
    p50 = f"{statistics.median(latencies):.1f} ms" if latencies else "n/a"
    out(f"  {'p50 trigger-to-stored':<28}{p50:>10}")
    out("")
    out(f"  {'device':<10}{'item_id':>11}{'dwell_ms':>10}{'stored score':>15}{'direct score':>15}")
    for device_id, payload, expect in rows[:5]:
        shown = "missing" if expect is None else f"{expect['score']:.6f}"
        out(f"  {device_id:<10}{payload['item_id']:>11}{payload['dwell_ms']:>10}{payload['score']:>15.6f}{shown:>15}")
    ok = n_stored == want and mismatches == 0
    out("")
    out("every stored score equals the same features scored directly" if ok else
        f"FAILED: {n_stored} of {want} scores stored, {mismatches} differ from the direct ones")
    return 0 if ok else 1
