"""A task's data folder is its own: a run sees `<agent state>/stream/data/<its task>` and no other task's
(a federated job's local samples are private to that job; docs/security.md, row D23)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.sandbox import detect_level
from edgerun.stream.agent_hooks import StreamHooks

pytestmark = pytest.mark.xdist_group("fleet-agent")
LEVEL = detect_level()

# A hostile task, run once on its data folder as a federated round is: it lists the data root, lists and
# reads the other task's folder by name, and reads its own samples. Every answer goes into its output.
THIEF = """
import os

def attempt(call):
    try:
        return call()
    except OSError as exc:
        return type(exc).__name__

def run(inputs):
    mine = inputs["data_dir"]
    root = os.path.dirname(mine)
    other = os.path.join(root, {victim!r})
    return {{"own": attempt(lambda: open(os.path.join(mine, "samples.txt")).read()),
             "root": attempt(lambda: sorted(os.listdir(root))),
             "other_listing": attempt(lambda: sorted(os.listdir(other))),
             "other_secret": attempt(lambda: open(os.path.join(other, "secret.txt")).read())}}
"""


def _others_may_run_this_python() -> bool:
    """At the rlimit levels a run's own uid starts this interpreter from the host (no mount view)."""
    import sys

    path = Path(sys.executable).resolve()
    return all(p.stat().st_mode & 0o001 for p in path.parents)


LEVELS = [pytest.param(LEVEL, id=LEVEL), pytest.param("rlimit-only", id="rlimit-only", marks=pytest.mark.skipif(
    not _others_may_run_this_python(), reason="this Python lies in a folder other uids cannot traverse"))]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_task_reads_its_own_data_folder_and_not_another_tasks(shared_server: FleetServer, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, level: str,
                                                                warm: bool) -> None:
    suffix = uuid.uuid4().hex[:8]
    device, thief, victim = f"data-dev-{suffix}", f"thief-{suffix}", f"victim-{suffix}"
    shared_server.admin().publish(
        make_task(tmp_path, thief, 1, body=THIEF.format(victim=victim), limits={"timeout_s": 60},
                  run_once={"record_id": f"{thief}:1"}, targeting={"kind": "device", "values": [device]}),
        shared_server.keys, {"steps": [100], "min_reports": 10**6})
    monkeypatch.setenv("EDGERUN_ISOLATION", level)
    agent = shared_server.agent(device, tmp_path / "agent", warm_workers=warm)
    hooks = StreamHooks.for_agent(agent)
    agent.hooks = hooks
    assert agent.isolation == level
    for task, name, text in ((thief, "samples.txt", "the thief's own samples"),
                             (victim, "secret.txt", "the victim's private samples")):
        (hooks.data_root / task).mkdir()
        (hooks.data_root / task / name).write_text(text)
    try:
        agent.step()  # installs the thief's version and runs it once, in the compute container
        records = hooks.pipeline.store.read(thief)
        assert len(records) == 1, (agent.errors, hooks.failed_runs)
        seen: dict[str, Any] = records[0].payload
    finally:
        hooks.close()
    assert seen["own"] == "the thief's own samples"
    if level.startswith("bwrap"):
        # Only its own folder is in the run's mount view: the victim's does not exist there.
        assert seen["root"] == [thief]
        assert seen["other_listing"] == seen["other_secret"] == "FileNotFoundError"
    else:
        # No mount view (the documented limit of the rlimit levels): the run's own uid cannot list the data
        # root, but reads another task's folder by name where its modes let others read it.
        assert seen["root"] == "PermissionError"
