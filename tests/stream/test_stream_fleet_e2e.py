"""End to end: a task published through the fleet platform with a trigger condition runs on an agent when
its events occur (emitted by a separate app process), and its output reaches the fleet server's store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from stream_helpers import REPO, free_port, token_file

from edgerun.fleet.admin_client import AdminClient
from edgerun.fleet.agent import Agent
from edgerun.fleet.package import pack_task
from edgerun.fleet.signing import KeyDir
from edgerun.stream.agent_hooks import StreamHooks
from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.uploader import Backoff

TASK_BODY = '''
from edgerun.stream.storage import read_outputs

def run(inputs):
    events = inputs["events"]
    earlier = read_outputs(inputs["outputs_db"], "cart_intent")  # collective storage, from the container
    return {"item": events[0]["contents"]["item"], "task": inputs["task_id"],
            "seconds_to_cart": (events[-1]["time_ms"] - events[0]["time_ms"]) / 1000,
            "earlier_items": [r["payload"]["item"] for r in earlier]}
'''


@pytest.fixture
def fleet_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edgerun", "fleet", "serve", "--port", str(port),
                                 "--data", str(tmp_path / "data"), "--keys", str(keys.path),
                                 "--admin-token-file", str(token_file(tmp_path / "admin", "admin-secret")),
                                 "--enroll-token-file", str(token_file(tmp_path / "enroll", "enroll-secret"))],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield url, keys
    proc.terminate()
    proc.wait(10)


def test_published_trigger_task_runs_on_the_agent_and_its_output_reaches_the_cloud(
        tmp_path: Path, fleet_server: tuple[str, KeyDir]) -> None:
    url, keys = fleet_server
    src = tmp_path / "cart-intent"
    src.mkdir()
    (src / "task.json").write_text(json.dumps({
        "name": "cart_intent", "version": 1, "entry": "main.py",
        "triggers": [{"sequence": ["page_enter@item", "click.add_cart"], "within_s": 600}]}))
    (src / "main.py").write_text(TASK_BODY)
    pack_task(src, tmp_path / "cart-intent.tar")
    AdminClient(url, "admin-secret").publish(tmp_path / "cart-intent.tar", keys, {"steps": [100], "min_reports": 100})

    agent = Agent(url, "phone-1", tmp_path / "agent", root_path=keys.latest_root_path(),
                  enroll_token="enroll-secret")
    hooks = StreamHooks.for_agent(agent, backoff=Backoff(base_s=0.01, cap_s=0.1))
    agent.hooks = hooks
    try:
        agent.step()  # check in, install, announce: the pipeline now knows the task's trigger
        assert hooks.pipeline.trie.task_ids == ["cart_intent"]

        # The app is another process: it writes to the agent's durable event queue.
        emit = [sys.executable, "-m", "edgerun", "stream", "emit", "--agent-state", str(agent.state_dir)]
        subprocess.run([*emit, "--kind", "page_enter", "--page", "item", "--contents", '{"item": 42}'],
                       check=True, cwd=REPO, capture_output=True)
        app = EventEmitter(agent.state_dir / "stream")  # the same queue, written from this process
        app.emit("scroll", "item")
        app.emit("click", "item", event_id="click.add_cart")
        app.emit("click", "item", event_id="click.add_cart")  # the same prefix: no second run
        app.emit("page_exit", "item")
        app.emit("page_enter", "item", contents={"item": 43})
        app.emit("click", "item", event_id="click.add_cart")

        agent.step()  # pump: trigger matches → task runs in the compute container → output stored → uploaded
        response = httpx.get(f"{url}/v1/stream/records", params={"device_id": "phone-1"},
                             headers={"Authorization": f"Bearer {agent.token}"})
        response.raise_for_status()
        records = sorted(response.json(), key=lambda r: r["payload"]["item"])
        assert [r["payload"]["item"] for r in records] == [42, 43]
        assert records[0]["task_id"] == "cart_intent" and records[0]["payload"]["task"] == "cart_intent"
        assert records[0]["payload"]["seconds_to_cart"] >= 0
        # The second run read the first run's output from collective storage.
        assert [r["payload"]["earlier_items"] for r in records] == [[], [42]]
        assert hooks.pipeline.counters()["uploaded"] == 2
        # The runs went through the agent's container and were reported like any other run.
        assert AdminClient(url, "admin-secret").device("phone-1")["reports"] == {"success": 2}
        # Another device's token cannot read phone-1's records.
        other = httpx.get(f"{url}/v1/stream/records", params={"device_id": "phone-1"},
                          headers={"Authorization": "Bearer not-a-token"})
        assert other.status_code == 403
    finally:
        hooks.close()
        agent.close()
