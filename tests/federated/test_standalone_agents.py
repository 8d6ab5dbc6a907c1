"""Rounds driven by `edgerun fleet federated run` among standalone `edgerun fleet agent` processes: each
round's invitation is a signed release targeted at the sampled devices; each agent runs it once on its own
data folder and its stream tunnel uploads the update; the driver collects, closes, evaluates and invites
the next round. Both rounds' global weights equal FedAvg computed directly in numpy from the same seeds
and data, each update applied once, and the final weights reach the devices as a plain release."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgerun.fleet import database
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.collector import fetch_records
from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg
from edgerun.fleet.federated.publisher import release_version
from edgerun.fleet.federated.rounds import FederatedJob
from edgerun.fleet.federated.training_task import SAMPLES_FILE, record_id, write_training_task
from edgerun.fleet.local_server import start_server, token_file
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.task_schema import validate_task_config
from edgerun.stream.agent_hooks import DATA_DIR, STREAM_STATE_DIR
from edgerun.training import write_weights

REPO = Path(__file__).resolve().parents[2]
JOB, SEED, DEVICES = "digits-agents", 5, 3


def _edgerun(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgerun", *args], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, **kw)  # type: ignore[call-overload]


def test_run_drives_rounds_among_standalone_agents_equal_to_a_direct_numpy_fedavg(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path / "server", keys)
    agents: list[subprocess.Popen[str]] = []
    try:
        shards, (held_images, held_labels) = digits_split(DEVICES, SEED)
        model, _, initial = digits_model(SEED, lr=0.5)
        write_training_task(tmp_path / "task", JOB, model, initial, epochs=1)
        write_weights(tmp_path / "initial.weights", initial, source="test")
        np.savez(tmp_path / "held-out.npz", images=held_images, labels=held_labels)
        enroll = token_file(tmp_path / "enroll", server.enroll_token)
        admin_token = token_file(tmp_path / "admin", server.admin_token)
        for i, (images, labels) in enumerate(shards):
            data = tmp_path / f"phone-{i}" / STREAM_STATE_DIR / DATA_DIR / JOB
            data.mkdir(parents=True)
            np.savez(data / SAMPLES_FILE, images=images, labels=labels)
            agents.append(_edgerun("fleet", "agent", "--server", server.url, "--device-id", f"phone-{i}",
                                   "--state", str(tmp_path / f"phone-{i}"), "--root",
                                   str(keys.latest_root_path()), "--enroll-token-file", str(enroll),
                                   "--no-push", "--interval", "0.5", "--quiet", stderr=subprocess.PIPE))
        common = ["--data", str(server.data), "--name", JOB]
        start = _edgerun("fleet", "federated", "start", *common, "--weights", str(tmp_path / "initial.weights"),
                         "--rounds", "2", "--per-round", str(DEVICES), "--deadline-s", "600", "--norm-bound", "50",
                         "--max-drop", "1", "--seed", str(SEED), "--epochs", "1", "--server-lr", "2")
        assert start.wait(120) == 0
        run = _edgerun("fleet", "federated", "run", *common, "--server", server.url, "--admin-token-file",
                       str(admin_token), "--keys", str(keys.path), "--task", str(tmp_path / "task"),
                       "--held-out", str(tmp_path / "held-out.npz"), "--poll-s", "0.5",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = run.communicate(timeout=400)
        assert run.returncode == 0, out
        assert f"federated job {JOB!r} is done" in out

        engine = database.create_engine(database.sqlite_url(server.data))
        job = FederatedJob(engine, JOB, tmp_path / "unused")
        rounds = job.status()["rounds"]
        assert [(r["round"], r["outcome"], r["participants"], r["duplicates"], r["stragglers"], r["refused"])
                for r in rounds] == [(1, "published", 3, 0, 0, {}), (2, "published", 3, 0, 0, {})]
        expect = direct_fedavg(model, initial, shards, [[0, 1, 2], [0, 1, 2]], seed=SEED, epochs=1, server_lr=2.0)
        for version, reference in zip((2, 3), expect, strict=True):
            got = job.global_weights(version)
            for name, array in reference.items():
                np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6)
        assert any(not np.allclose(expect[1][name], initial[name]) for name in initial)

        # each device uploaded one record per round, under the round's id: nothing ran twice
        admin = server.admin()
        records = fetch_records(server.url, server.admin_token, JOB)
        assert sorted((r["device_id"], r["record_id"]) for r in records) == sorted(
            (f"phone-{i}", record_id(JOB, r)) for i in range(DEVICES) for r in (1, 2))
        # the invitations went to the sampled devices; the final weights to the job's targeting
        versions = {r["version"] for r in admin.releases() if r["task"] == JOB}
        assert versions == {release_version(1), release_version(2), release_version(3)}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                admin.device(f"phone-{i}")["profile"].get("tasks", {}).get(JOB) != release_version(3) for i in range(DEVICES)):
            time.sleep(0.5)
        assert all(admin.device(f"phone-{i}")["profile"]["tasks"][JOB] == release_version(3) for i in range(DEVICES))
        admin.close()
        engine.dispose()
    finally:
        for proc in agents:
            proc.terminate()
        for proc in agents:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()


def test_run_once_is_checked_like_every_task_config_field() -> None:
    base = {"name": "t", "version": 1, "entry": "main.py"}
    assert validate_task_config({**base, "run_once": {"record_id": "federated:t:1"}})["run_once"] == {
        "record_id": "federated:t:1"}
    with pytest.raises(FleetError, match=r"run_once has unknown key\(s\) \['record'\]"):
        validate_task_config({**base, "run_once": {"record": "x"}})
    with pytest.raises(FleetError, match=r"run_once\.record_id must be a string of 1 to 200 characters"):
        validate_task_config({**base, "run_once": {"record_id": ""}})
