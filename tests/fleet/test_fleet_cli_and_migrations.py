"""The command line end to end (pack, publish, agent --once, release list/abort, keys) and the migrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from fleet_helpers import REPO, FleetServer, token_file

from edgerun.fleet.database import MIGRATIONS, create_engine, upgrade

pytestmark = pytest.mark.xdist_group("fleet-cli")


@pytest.fixture(scope="module")
def server(shared_server: FleetServer) -> FleetServer:
    return shared_server


def edgerun(*args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EDGERUN_FLEET_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "edgerun", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def test_cli_pack_publish_agent_release(server: FleetServer, tmp_path: Path) -> None:
    src = tmp_path / "clitask"
    src.mkdir()
    (src / "task.json").write_text(json.dumps({"name": "clitask", "version": 2, "schedule": {"every_s": 0}}))
    (src / "main.py").write_text("def run(inputs):\n    return {'ran': True}\n")
    pkg = tmp_path / "clitask.tar"
    r = edgerun("task", "pack", str(src), "-o", str(pkg))
    assert r.returncode == 0 and "clitask v2" in r.stdout, r.stderr
    r = edgerun("task", "publish", str(pkg), "--keys", str(server.keys.path), "--server", server.url,
                "--steps", "100", "--min-reports", "1", token=server.admin_token)
    assert r.returncode == 0 and "published clitask v2" in r.stdout, r.stderr
    enroll_file = token_file(tmp_path / "enroll_token", server.enroll_token)  # tokens never in argv
    r = edgerun("fleet", "agent", "--server", server.url, "--device-id", "cli-dev", "--state", str(tmp_path / "a"),
                "--root", str(server.keys.latest_root_path()), "--enroll-token-file", str(enroll_file), "--once")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"]["clitask"] == 2
    assert server.admin().device("cli-dev")["reports"] == {"success": 1}
    r = edgerun("fleet", "release", "list", "--server", server.url, token=server.admin_token)
    assert r.returncode == 0 and "clitask" in r.stdout
    # User errors print one clean line, not a traceback.
    r = edgerun("fleet", "release", "list", "--server", server.url, token="wrong")
    assert r.returncode == 1 and r.stderr.startswith("edgerun: error: server refused") and "Traceback" not in r.stderr
    r = edgerun("task", "publish", str(pkg), "--keys", str(server.keys.path), "--server", server.url,
                token=server.admin_token)
    assert r.returncode == 1 and "must be above" in r.stderr
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/devices/{device_id}/checkin" in spec["paths"] and "/v1/admin/releases" in spec["paths"]


def test_migrations_upgrade_an_old_database(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(sa.text(
            "INSERT INTO releases (task, version, envelope, rollback_envelope, targeting, policy, stage, step, paused,"
            " exposed, step_success, step_failure, total_success, total_failure, reason, sim_lease_until, created_at,"
            " updated_at) VALUES ('t', 1, '{}', '{}', '{}', '{}', 'gray', 0, 0, 1, 0, 0, 0, 0, '', 0, 0, 0)"))
        conn.execute(sa.text("INSERT INTO reports (id, device_id, task, version, outcome, latency_ms, error, received_at)"
                             " VALUES ('run-1', 'd', 't', 1, 'success', 1.5, '', 0)"))
    upgrade(engine)  # what the server does at start
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == ScriptDirectory.from_config(cfg).get_current_head()
        assert conn.execute(sa.text("SELECT step_population FROM releases")).scalar() == 0
        # 0003 rebuilt reports under the key (device, run id); old reports survive and stay counted.
        assert conn.execute(sa.text("SELECT device_id, latency_ms, counted FROM reports")).one() == ("d", 1.5, 1)
    engine.dispose()
