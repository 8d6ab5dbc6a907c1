"""Hostile task code, run by a real agent against a real server, tries each escape of issue #17; all refused.

Each task is given the agent's state folder in its inputs (an attacker could guess it) and returns what
each attempt got; the test checks both the task's own account and the agent's files afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.sandbox import detect_level

pytestmark = [pytest.mark.xdist_group("fleet-agent"),
              pytest.mark.skipif(not detect_level().startswith("bwrap"),
                                 reason=f"bubblewrap is not usable here (level {detect_level()}); "
                                        "install it: apt-get install bubblewrap")]

# Every attempt is caught and written down; the run succeeds, so the report says what the task achieved.
ATTACKS = r'''
import os, sqlite3

def attempt(fn):
    try:
        return "DONE: " + str(fn())[:200]
    except Exception as exc:
        return "refused: " + type(exc).__name__

def run(inputs):
    state = inputs["state"]
    db = os.path.join(state, "agent.db")
    def read_token():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        return con.execute("SELECT value FROM meta WHERE key = 'token'").fetchone()
    def read_raw():
        with open(db, "rb") as f:
            return f.read(100)
    def replace_root():
        con = sqlite3.connect(db)
        con.execute("UPDATE meta SET value = '{}' WHERE key = 'root'")
        con.commit()
        return "root replaced"
    def delete_outbox():
        con = sqlite3.connect(db)
        n = con.execute("DELETE FROM outbox").rowcount
        con.commit()
        return n
    def append_other():
        with open(inputs["victim_main"], "a") as f:
            f.write("\nSTOLEN = True\n")
        return "appended"
    def swap_blob():
        with open(inputs["blob"], "wb") as f:
            f.write(b"evil")
        return "swapped"
    def write_own_files():
        with open(os.path.join(os.getcwd(), "main.py"), "a") as f:
            f.write("# persisted\n")
        return "own main.py changed"
    def list_state():
        return os.listdir(state)
    return {"read_token": attempt(read_token), "read_raw": attempt(read_raw),
            "replace_root": attempt(replace_root), "delete_outbox": attempt(delete_outbox),
            "append_other": attempt(append_other), "swap_blob": attempt(swap_blob),
            "write_own_files": attempt(write_own_files), "list_state": attempt(list_state),
            "uid": os.getuid(), "env": sorted(os.environ)}
'''


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hostile_task_cannot_reach_agent_state_other_tasks_or_blobs(shared_server: FleetServer, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_ENROLL_TOKEN", "enrol-secret-in-the-agents-environment")
    admin = shared_server.admin()
    admin.publish(make_task(tmp_path, "esc-victim", 2), shared_server.keys, {"steps": [100], "min_reports": 100})
    admin.publish(make_task(tmp_path, "esc-attacker", 2, body=ATTACKS, files={"data.bin": b"\x05" * 1000}),
                  shared_server.keys, {"steps": [100], "min_reports": 100})
    agent = shared_server.agent("esc-dev", tmp_path / "agent")
    agent.check_in()
    victim_main = agent.installer.active()["esc-victim"][1] / "main.py"
    blob = agent.installer.blobs / hashlib.sha256(b"\x05" * 1000).hexdigest()
    before = {p: _sha(p) for p in (victim_main, blob)}
    root_before = agent.state.get("root")

    result = agent.run_task("esc-attacker", {"state": str(agent.state_dir), "victim_main": str(victim_main),
                                             "blob": str(blob)})
    assert result.outcome == "success", result.error
    got = result.output
    for attack in ("read_token", "read_raw", "replace_root", "delete_outbox", "append_other", "swap_blob",
                   "write_own_files", "list_state"):
        assert got[attack].startswith("refused"), (attack, got[attack])
    assert got["uid"] not in (0, os.getuid())  # its own identity, never the agent's
    # Nor its environment: the one EDGERUN variable is the one the agent sets, naming the read-only search cache.
    assert not [name for name in got["env"] if "TOKEN" in name or
                (name.startswith("EDGERUN") and name != "EDGERUN_CACHE_DIR")]
    assert agent.state.get("root") == root_before
    assert {p: _sha(p) for p in before} == before
    # Its report was queued by the agent, where the task cannot reach, and reaches the server.
    assert agent.flush_reports() == 1
    assert admin.device("esc-dev")["reports"] == {"success": 1}


def test_agent_db_and_secrets_are_private_even_without_a_mount_view(tmp_path: Path) -> None:
    from edgerun.fleet.agent_state import AgentState
    from edgerun.fleet.installer import Installer

    Installer(tmp_path / "state")
    state = AgentState(tmp_path / "state" / "agent.db")
    state.put("token", "secret")
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "state").iterdir() if p.is_file()}
    assert modes and all(mode == 0o600 for mode in modes.values()), modes  # agent.db, -wal, -shm
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o711
    assert (tmp_path / "state" / "blobs").stat().st_mode & 0o777 == 0o700
    state.close()


def test_files_changed_on_disk_are_refused_before_the_run_and_rebuilt(shared_server: FleetServer,
                                                                       tmp_path: Path) -> None:
    """Whoever changes an installed file or a cached blob (not a task: it cannot), the run refuses it."""
    admin = shared_server.admin()
    admin.publish(make_task(tmp_path, "esc-tamper", 2, body="def run(i):\n    return {'ok': 1}\n",
                            files={"w.bin": b"\x01" * 4096}), shared_server.keys, {"steps": [100], "min_reports": 100})
    agent = shared_server.agent("esc-tamper-dev", tmp_path / "agent")
    agent.check_in()
    folder = agent.installer.active()["esc-tamper"][1]
    main = folder / "main.py"
    main.chmod(0o644)
    main.write_text(main.read_text() + "\nimport os; os.system('echo owned')\n")
    r = agent.run_task("esc-tamper")
    assert r.outcome == "crash" and "does not match its signed digest" in r.error
    # A swapped cached blob is caught when the version is rebuilt: re-fetched, then the run works again.
    blob = agent.installer.blobs / hashlib.sha256(b"\x01" * 4096).hexdigest()
    blob.write_bytes(b"\x02" * 4096)
    assert "esc-tamper" not in agent.installer.active()
    agent.check_in()
    assert _sha(blob) == hashlib.sha256(b"\x01" * 4096).hexdigest()
    assert agent.run_task("esc-tamper").output == {"ok": 1}
    # A planted extra module next to main.py is refused too (it could be imported).
    folder = agent.installer.active()["esc-tamper"][1]
    folder.chmod(0o755)
    (folder / "json.py").write_text("raise SystemExit('planted')\n")
    r = agent.run_task("esc-tamper")
    assert r.outcome == "crash" and "not in the signed manifest" in r.error
    agent.flush_reports()
    assert admin.device("esc-tamper-dev")["reports"] == {"crash": 2, "success": 1}


def test_a_task_that_asks_for_more_isolation_than_the_device_has_is_refused_and_reported(
        shared_server: FleetServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_ISOLATION", "rlimit-only")  # this agent says it is a weak device
    admin = shared_server.admin()
    admin.publish(make_task(tmp_path, "esc-strict", 2, min_isolation="bwrap+cgroup"), shared_server.keys,
                  {"steps": [100], "min_reports": 100})
    agent = shared_server.agent("esc-weak-dev", tmp_path / "agent")
    assert agent.isolation == "rlimit-only"
    agent.check_in()
    assert "esc-strict" not in agent.profile().tasks
    assert any("needs isolation bwrap+cgroup" in e for e in agent.errors), agent.errors
    agent.check_in()  # refused again, reported once
    assert agent.flush_reports() == 1
    assert admin.device("esc-weak-dev")["reports"] == {"failure": 1}


def test_checkin_carries_the_isolation_level(shared_server: FleetServer, tmp_path: Path) -> None:
    agent = shared_server.agent("esc-level-dev", tmp_path / "agent")
    sent: list[dict[str, object]] = []
    real_post = agent.http.post

    def recording_post(url: str, **kw: object):  # type: ignore[no-untyped-def]
        if url.endswith("/checkin"):
            sent.append(json.loads(json.dumps(kw["json"])))
        return real_post(url, **kw)  # type: ignore[arg-type]

    agent.http.post = recording_post  # type: ignore[method-assign]
    agent.check_in()
    assert sent[0]["isolation"] == detect_level()
