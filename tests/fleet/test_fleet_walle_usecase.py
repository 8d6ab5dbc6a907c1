"""Walle's own use case end to end: page events from the app → the trigger trie (an item page's exit) →
IPV features → the zoo's DIN recommendation model, as an edgerun program inside a task running in a warm
isolated worker → its score sent through the real-time tunnel → stored in the cloud end of the server.
The steps are edgerun/fleet/walle_demo.py's, which `edgerun fleet demo walle` runs too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import REPO, FleetServer

from edgerun.fleet import walle_demo

pytestmark = pytest.mark.xdist_group("fleet-agent")


def test_page_events_to_a_din_score_in_the_cloud(server: FleetServer, tmp_path: Path) -> None:
    program = walle_demo.export_din(tmp_path / "din.edgerun")
    admin = server.admin()
    walle_demo.publish_rank_task(admin, walle_demo.pack_rank_task(tmp_path, program), server.keys)
    agent = server.agent("walle-user", tmp_path / "agent", warm_workers=True)
    hooks = walle_demo.TimedHooks.attach(agent)
    try:
        agent.step()  # install, announce: the trie knows the trigger, a warm worker loads the model
        assert hooks.pipeline.trie.task_ids == [walle_demo.TASK_ID]
        session = walle_demo.session_events(18, 60)
        walle_demo.feed(agent, session)
        hooks.pipeline.pump()  # matches → runs → stored → sent at once (realtime), no upload() call
        records = [r["payload"] for r in walle_demo.stored_records(server.url, agent.token, "walle-user")]

        # What the cloud holds is what the same features and program give here.
        expected = walle_demo.direct_scores(session, program)
        visits = len(walle_demo.item_visits(session))
        assert visits >= 2 and len(expected) == visits and len(records) == visits
        got = sorted(records, key=lambda r: json.dumps(r["item_id"]))
        want = sorted(expected, key=lambda r: json.dumps(r["item_id"]))
        for g, w in zip(got, want, strict=True):
            assert g["item_id"] == w["item_id"] and g["dwell_ms"] == w["dwell_ms"]
            assert g["score"] == pytest.approx(w["score"], rel=1e-6) and 0 < g["score"] < 1
        assert hooks.pipeline.counters()["uploaded"] == visits
        assert hooks.runs == visits and set(hooks.fired_ms) == {r["item_id"] for r in records}
        agent.flush_reports()
        assert admin.device("walle-user")["reports"] == {"success": visits}
    finally:
        hooks.close()
        agent.close()
        admin.close()


def test_the_demo_command_runs_the_use_case_and_cleans_up(tmp_path: Path) -> None:
    """`edgerun fleet demo walle` as a user runs it: its own server, devices and events, a table, exit 0."""
    # torch.export makes torch's own compile cache under TMPDIR; it is torch's, not a file the demo leaves.
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path / "tmp"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch-cache")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "edgerun", "fleet", "demo", "walle", "--devices", "2",
                           "--events", "30"], capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = dict(m.groups() for m in re.finditer(r"^  (\S.*?)  +(\S+)", proc.stdout, re.MULTILINE))
    visits = int(re.findall(r"item page visits: (\d+)", proc.stdout)[0])
    assert visits >= 2 and int(table["events sent"]) >= 60  # at least one item page visit per device
    for row in ("triggers fired", "runs (warm, isolated)", "uploads (records acked)", "stored in the cloud"):
        assert int(table[row]) == visits, proc.stdout
    assert float(table["p50 trigger-to-stored"]) > 0
    scores = re.findall(r"^  walle-\d\s+\d+\s+\d+\s+(\S+)\s+(\S+)$", proc.stdout, re.MULTILINE)
    assert len(scores) == min(5, visits) and all(stored == direct for stored, direct in scores)
    assert "every stored score equals the same features scored directly" in proc.stdout
    assert "admin-secret" not in proc.stdout and not list((tmp_path / "tmp").iterdir())  # random tokens; nothing left
    bad = subprocess.run([sys.executable, "-m", "edgerun", "fleet", "demo", "walle", "--devices", "0"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert bad.returncode != 0 and "at least 1" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "used" / "keys").mkdir(parents=True)
    bad = subprocess.run([sys.executable, "-m", "edgerun", "fleet", "demo", "walle", "--keep", str(tmp_path / "used")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert bad.returncode != 0 and "new or empty folder" in bad.stderr and "Traceback" not in bad.stderr
