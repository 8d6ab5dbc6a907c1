"""Walle's own use case end to end: page events from the app → the trigger trie (an item page's exit) →
IPV features → the zoo's DIN recommendation model, as an edgerun program inside a task running in a warm
isolated worker → its score sent through the real-time tunnel → stored in the cloud end of the server."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.stream.agent_hooks import StreamHooks
from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.ipv import IPV_TRIGGER, ITEM_PAGE, generate_session, ipv_feature
from edgerun.stream.uploader import Backoff

pytestmark = pytest.mark.xdist_group("fleet-agent")

# The task: IPV features of the visit the trigger captured, turned into DIN's inputs (the items exposed on
# the page as the history, the visited item as the target), scored by the model the package carries.
RANK_TASK = """\
import os
import numpy as np
import edgerun
from edgerun.stream.events import Event
from edgerun.stream.ipv import ipv_feature

ITEMS, CATEGORIES, LENGTH = 5000, 200, 20
MODEL = edgerun.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "din.edgerun"))

def din_inputs(feature):
    history = [i % (ITEMS - 1) + 1 for i in feature["exposed_items"]][:LENGTH]
    items = np.zeros((1, LENGTH), np.int64)
    items[0, :len(history)] = history
    cats = np.where(items > 0, items % (CATEGORIES - 1) + 1, 0)
    target = np.array([feature["item_id"] % (ITEMS - 1) + 1], np.int64)
    return [items, cats, target, target % (CATEGORIES - 1) + 1]

def run(inputs):
    feature = ipv_feature([Event.from_dict(e) for e in inputs["events"]])
    score = float(np.asarray(MODEL(*din_inputs(feature))).reshape(-1)[0])
    return {"item_id": feature["item_id"], "dwell_ms": feature["dwell_ms"], "score": score}
"""


def test_page_events_to_a_din_score_in_the_cloud(server: FleetServer, tmp_path: Path) -> None:
    import edgerun.zoo

    zoo = edgerun.zoo.get("din")
    program = tmp_path / "din.edgerun"
    edgerun.export(zoo.build(), zoo.example_inputs()).save(program)
    admin = server.admin()
    admin.publish(make_task(tmp_path, "ipv-rank", 2, body=RANK_TASK, triggers=[IPV_TRIGGER],
                            limits={"timeout_s": 30}, files={"models/din.edgerun": program.read_bytes()}),
                  server.keys, {"steps": [100], "min_reports": 100})
    agent = server.agent("walle-user", tmp_path / "agent", warm_workers=True)
    hooks = StreamHooks.for_agent(agent, backoff=Backoff(base_s=0.01, cap_s=0.1), realtime=True)
    agent.hooks = hooks
    try:
        agent.step()  # install, announce: the trie knows the trigger, a warm worker loads the model
        assert hooks.pipeline.trie.task_ids == ["ipv-rank"]
        session = generate_session(random.Random(18), 1_700_000_000_000, visits=3)
        app = EventEmitter(agent.state_dir / "stream")
        for e in session:
            app.emit(e.kind.value, e.page_id, time_ms=e.time_ms, event_id=e.event_id, contents=e.contents)
        hooks.pipeline.pump()  # matches → runs → stored → sent at once (realtime), no upload() call
        response = httpx.get(f"{server.url}/v1/stream/records", params={"device_id": "walle-user"},
                             headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
        response.raise_for_status()
        records = [r["payload"] for r in response.json() if r["task_id"] == "ipv-rank"]

        # What the cloud holds is what the same features and program give here.
        visits: list[list[Any]] = []
        for e in session:
            if e.page_id == ITEM_PAGE and e.kind.value == "page_enter":
                visits.append([])
            if e.page_id == ITEM_PAGE:  # a visit: its enter, everything on the item page, its exit
                visits[-1].append(e)
        namespace: dict[str, Any] = {"__file__": str(tmp_path / "main.py")}
        exec(compile(RANK_TASK.replace("MODEL = edgerun.load", "_unused = str"), "rank", "exec"), namespace)
        model = edgerun.load(program)
        expected = []
        for visit in visits:
            feature = ipv_feature(visit)
            score = float(np.asarray(model(*namespace["din_inputs"](feature))).reshape(-1)[0])
            expected.append({"item_id": feature["item_id"], "dwell_ms": feature["dwell_ms"], "score": score})
        assert len(records) == 3
        got = sorted(records, key=lambda r: json.dumps(r["item_id"]))
        want = sorted(expected, key=lambda r: json.dumps(r["item_id"]))
        for g, w in zip(got, want, strict=True):
            assert g["item_id"] == w["item_id"] and g["dwell_ms"] == w["dwell_ms"]
            assert g["score"] == pytest.approx(w["score"], rel=1e-6) and 0 < g["score"] < 1
        assert hooks.pipeline.counters()["uploaded"] == 3
        agent.flush_reports()
        assert admin.device("walle-user")["reports"] == {"success": 3}
    finally:
        hooks.close()
        agent.close()
        admin.close()
