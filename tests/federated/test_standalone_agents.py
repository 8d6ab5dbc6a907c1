"""Rounds driven by `edgerun fleet federated run` among standalone `edgerun fleet agent` processes: each
round's invitation is a signed release targeted at the sampled devices; each agent runs it once on its own
data folder and its stream tunnel uploads the update; the driver collects, closes, evaluates and invites
the next round. Both rounds' global weights equal FedAvg computed directly in numpy from the same seeds
and data, each update applied once, and the final weights reach the devices as a plain release. A rolled-back
round's successor is invited with the last good weights under its own round number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from edgerun.fleet import database
from edgerun.fleet.agent import Agent
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.collector import fetch_records
from edgerun.fleet.federated.coordinator import RoundDriver
from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg
from edgerun.fleet.federated.fedavg import fedavg
from edgerun.fleet.federated.local import local_update
from edgerun.fleet.federated.publisher import WEIGHTS_NAME, FleetPublisher, release_version
from edgerun.fleet.federated.round_store import records as fed_records
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, fleet_devices
from edgerun.fleet.federated.training_task import SAMPLES_FILE, record_id, write_training_task
from edgerun.fleet.local_server import start_server, token_file
from edgerun.fleet.package import read_package
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.task_schema import validate_task_config
from edgerun.stream.agent_hooks import DATA_DIR, STREAM_STATE_DIR, StreamHooks
from edgerun.training import read_weights, write_weights

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

        # each device uploaded one record per round, under the round's id: nothing ran twice; the job
        # recorded each, and the collector removed them from the stream store
        admin = server.admin()
        with engine.connect() as conn:
            taken = conn.execute(sa.select(fed_records.c.device, fed_records.c.record_id, fed_records.c.verdict)
                                 .where(fed_records.c.job == JOB)).all()
        assert sorted(tuple(r) for r in taken) == sorted(
            (f"phone-{i}", record_id(JOB, r), "accepted") for i in range(DEVICES) for r in (1, 2))
        assert list(fetch_records(server.url, server.admin_token, JOB)) == []
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


def test_a_rolled_back_round_invites_the_next_with_the_last_good_weights_and_a_restarted_driver_goes_on(
        tmp_path: Path) -> None:
    """Round 2 is rolled back (its metric drops): round 3's invitation is task version 5 carrying version
    2's weights (round 1's), and round 3 trains from them. The driver is made again inside round 1: it
    finds the invitation already published and does not send it again."""
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path / "server", keys)
    agents: list[Agent] = []
    pipelines: list[StreamHooks] = []
    try:
        job_name, seed, devices = "digits-rollback", 7, 2
        shards, _ = digits_split(devices, seed)
        model, _, initial = digits_model(seed, lr=0.5)
        write_training_task(tmp_path / "task", job_name, model, initial, epochs=1)
        for i, (images, labels) in enumerate(shards):
            agent = server.agent(f"rb-{i}", tmp_path / f"rb-{i}")
            hooks = agent.hooks = StreamHooks.for_agent(agent)
            pipelines.append(hooks)
            (hooks.data_root / job_name).mkdir()
            np.savez(hooks.data_root / job_name / SAMPLES_FILE, images=images, labels=labels)
            agent.step()
            agents.append(agent)
        server.wait_seen()
        engine = database.create_engine(database.sqlite_url(server.data))
        job = FederatedJob.start(engine, JobConfig(job_name, rounds=3, per_round=devices, quorum=devices,
                                                   deadline_s=600, norm_bound=50, max_drop=0.05, seed=seed,
                                                   server_lr=2.0), initial, tmp_path / "updates")
        admin = server.admin()
        metrics = iter([0.9, 0.1, 0.95])  # round 2 falls 0.8 below the best: rolled back

        def driver() -> RoundDriver:
            return RoundDriver(job, FleetPublisher(admin, keys, tmp_path / "task", tmp_path / "packages"), admin,
                               lambda now: fleet_devices(engine, now - 600),
                               lambda: fetch_records(server.url, server.admin_token, job_name),
                               lambda weights: next(metrics))

        first = driver()
        assert first.step(time.time()) is None  # round 1 opened and invited
        again = driver()  # the driver started again inside round 1
        results = []
        deadline = time.monotonic() + 300
        while again.running() and time.monotonic() < deadline:
            for agent in agents:
                agent.step()
            result = again.step(time.time())
            if result is not None:
                results.append(result)
        assert [(r.round, r.outcome, r.version, r.participants) for r in results] == [
            (1, "published", 2, 2), (2, "rolled_back", 2, 2), (3, "published", 3, 2)]
        versions = sorted(r["version"] for r in admin.releases() if r["task"] == job_name)
        assert versions == [release_version(r) for r in (1, 2, 3, 4)]  # 3 invitations + the final weights

        invitation = read_package(tmp_path / "packages" / f"{job_name}-v{release_version(3)}.tar")
        blobs = {f.path: invitation.blobs[f.sha256] for f in invitation.files}
        assert json.loads(blobs["federated.json"])["round"] == 3
        (tmp_path / "round3.weights").write_bytes(blobs[WEIGHTS_NAME])
        round_one = job.global_weights(2)
        shipped = read_weights(tmp_path / "round3.weights")
        assert all(np.array_equal(shipped[n], round_one[n]) for n in round_one)
        [expect_one] = direct_fedavg(model, initial, shards, [[0, 1]], seed=seed, epochs=1, server_lr=2.0)
        updates = [(str(i), *local_update(model, expect_one, *shards[i], epochs=1, seed=(seed, 3)))
                   for i in range(devices)]
        expect_three = fedavg(expect_one, updates, 3, server_lr=2.0)
        for name in initial:
            np.testing.assert_allclose(round_one[name], expect_one[name], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(job.global_weights(3)[name], expect_three[name], rtol=1e-5, atol=1e-6)
        for agent in agents:
            agent.step()
            assert agent.profile().tasks[job_name] == release_version(4)
        admin.close()
        engine.dispose()
    finally:
        for hooks in pipelines:
            hooks.close()
        server.stop()


def test_run_refuses_an_unreadable_held_out_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgerun.cli import main

    (tmp_path / "held.npz").write_text("not an npz")
    assert main(["fleet", "federated", "run", "--data", str(tmp_path), "--name", "j", "--server",
                 "http://127.0.0.1:9", "--keys", str(tmp_path), "--task", str(tmp_path),
                 "--held-out", str(tmp_path / "held.npz")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgerun: error: --held-out") and "not an .npz of 'images' and 'labels'" in err
    assert "\n" not in err
