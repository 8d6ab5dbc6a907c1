"""A device agent killed (SIGKILL) during its training run, with real agents on a real fleet server: the
round closes at its deadline with that device counted as a straggler and the others' updates applied once
(weights equal to a direct numpy FedAvg over the survivors); the agent started again on the same state
reports the interrupted run, installs the next round's weights and takes part in round 2, whose weights
again equal the direct FedAvg, with nothing applied twice."""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import sqlite3
import time
from pathlib import Path

import numpy as np

from edgerun.fleet import database
from edgerun.fleet.agent import Agent
from edgerun.fleet.federated.collector import collect, fetch_records
from edgerun.fleet.federated.demo import JOB
from edgerun.fleet.federated.device import FederatedDevice
from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg
from edgerun.fleet.federated.publisher import FleetPublisher, release_version
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
from edgerun.fleet.federated.training_task import write_training_task
from edgerun.fleet.local_server import start_server
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile

SEED, DEVICES, VICTIM = 4, 3, 1


def _victim(url: str, root: str, state: str, enroll: str, images: np.ndarray, labels: np.ndarray) -> None:
    """The victim's process: marks the moment its training run is under way, then trains round 1."""
    def on_step(name: str, task: str) -> None:
        if name == "run-verified":
            (Path(state) / "training").touch()

    agent = Agent(url, f"phone-{VICTIM}", state, root_path=root, enroll_token=enroll, on_step=on_step)
    FederatedDevice(agent, JOB, images, labels).train(1, SEED, release_version(1))
    (Path(state) / "finished").touch()  # never reached: the test kills the process first


def test_an_agent_killed_during_training_is_a_straggler_and_rejoins_the_next_round(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path, keys, admin_token=secrets.token_urlsafe(24), enroll_token="enroll-secret")
    devices: list[FederatedDevice] = []
    try:
        shards, _ = digits_split(DEVICES, SEED)
        model, _, initial = digits_model(SEED, lr=0.5)
        task = write_training_task(tmp_path / "task", JOB, model, initial, epochs=1)
        admin = server.admin()
        publish = FleetPublisher(admin, keys, task, tmp_path / "packages", {"steps": [100], "min_reports": 1})
        publish(1, initial)
        engine = database.create_engine(database.sqlite_url(server.data))
        job = FederatedJob.start(engine, JobConfig(JOB, rounds=2, per_round=DEVICES, quorum=DEVICES, deadline_s=60.0,
                                                   max_drop=1.0, seed=SEED), initial, tmp_path / "updates")
        profiles = [DeviceProfile(f"phone-{i}") for i in range(DEVICES)]
        assert job.open_round(profiles, now=0.0) == [f"phone-{i}" for i in range(DEVICES)]

        state = tmp_path / f"phone-{VICTIM}"
        state.mkdir()
        victim = multiprocessing.get_context("fork").Process(target=_victim, args=(
            server.url, str(keys.latest_root_path()), str(state), "enroll-secret", *shards[VICTIM]))
        victim.start()
        deadline = time.monotonic() + 120
        while not (state / "training").exists():
            assert victim.is_alive() and time.monotonic() < deadline, "the victim never began its training run"
            time.sleep(0.01)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        assert not (state / "finished").exists()
        with sqlite3.connect(state / "agent.db") as conn:  # killed inside the run: its row is still 'running'
            assert conn.execute("SELECT count(*) FROM outbox WHERE task = ? AND state = 'running'",
                                (JOB,)).fetchone() == (1,)

        for i in range(DEVICES):
            if i != VICTIM:
                devices.append(FederatedDevice(server.agent(f"phone-{i}", tmp_path / f"phone-{i}"), JOB, *shards[i]))
                devices[-1].train(1, SEED, release_version(1))
        collect(job, fetch_records(server.url, server.admin_token, JOB), now=10.0)
        assert not job.ready(now=59.0)  # two of a quorum of three: the round waits for its deadline
        assert job.ready(now=60.0)
        first = job.close_round(evaluate=lambda w: 0.5, publish=publish)
        assert (first.outcome, first.participants, first.stragglers, first.duplicates, first.refused) == (
            "published", 2, 1, 0, {})

        # the victim's agent started again on its state: it reports the interrupted run, installs round 2's
        # weights and trains round 2 with the others
        again = FederatedDevice(server.agent(f"phone-{VICTIM}", state), JOB, *shards[VICTIM])
        devices.insert(VICTIM, again)
        assert job.open_round(profiles, now=100.0) == [f"phone-{i}" for i in range(DEVICES)]
        for device in devices:
            device.train(2, SEED, release_version(2))
        with sqlite3.connect(state / "agent.db") as conn:
            assert conn.execute("SELECT count(*) FROM outbox WHERE state = 'running'").fetchone() == (0,)
        verdicts = collect(job, fetch_records(server.url, server.admin_token, JOB), now=110.0)
        assert verdicts == {"accepted": DEVICES}  # round 1's updates are not offered again
        assert job.ready(now=110.0)
        second = job.close_round(evaluate=lambda w: 0.5, publish=publish)
        assert (second.outcome, second.participants, second.stragglers, second.duplicates) == ("published", 3, 0, 0)

        expect = direct_fedavg(model, initial, shards, [[0, 2], [0, 1, 2]], seed=SEED, epochs=1)
        for version, weights in zip((2, 3), expect):
            got = job.global_weights(version)
            for name, array in weights.items():
                np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6)
        again.agent.flush_reports()
        # the interrupted run, reported once as a crash, and round 2's run
        assert admin.device(f"phone-{VICTIM}")["reports"] == {"crash": 1, "success": 1}
        admin.close()
        engine.dispose()
    finally:
        for d in devices:
            d.close()
        server.stop()
