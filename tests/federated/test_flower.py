"""Flower interop: a real Flower server (Flower's own FedAvg, gRPC on loopback) and three Flower clients,
each an edgerun training task run by `EdgerunNumPyClient` in its own process of the Flower venv
(.venv-flower, scripts/setup.sh), train the digits MLP on non-IID shards. Every round's global weights equal
those of edgerun's own federated job (FederatedJob, FedAvg weighted by samples) on the same data and seeds,
and the loss Flower's clients report for each round equals the loss edgerun computes for those weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgerun.fleet import database
from edgerun.fleet.federated import pack_update
from edgerun.fleet.federated.digits_data import BATCH, digits_model, digits_split
from edgerun.fleet.federated.local import local_update
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
from edgerun.fleet.federated.training_task import write_training_task
from edgerun.fleet.targeting import DeviceProfile

REPO = Path(__file__).resolve().parents[2]
FLOWER_PYTHON = REPO / ".venv-flower" / "bin" / "python"
CLIENTS, ROUNDS, SEED = 3, 2, 7

pytestmark = pytest.mark.skipif(not FLOWER_PYTHON.exists(),
                                reason="no .venv-flower (scripts/setup.sh makes it from requirements-flower.txt)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flower_federation(tmp_path: Path, names: list[str], initial: dict[str, np.ndarray],
                       data: list[Path], task: Path) -> Path:
    """Run the Flower server and its clients as processes of the Flower venv; the server's output folder."""
    out = tmp_path / "flower"
    out.mkdir()
    np.savez(tmp_path / "initial.npz", *[initial[n] for n in names])
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRPC_VERBOSITY": "ERROR"}
    server = subprocess.Popen([str(FLOWER_PYTHON), str(Path(__file__).with_name("flower_server.py")),
                               "--address", address, "--initial", str(tmp_path / "initial.npz"),
                               "--clients", str(CLIENTS), "--rounds", str(ROUNDS), "--seed", str(SEED),
                               "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    clients = [subprocess.Popen([str(FLOWER_PYTHON), "-m", "edgerun.fleet.federated.flower_client",
                                 "--server", address, "--task", str(task), "--data", str(path)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for path in data]
    try:
        server_log, _ = server.communicate(timeout=240)
        logs = [c.communicate(timeout=60)[0] for c in clients]
    finally:
        for p in (server, *clients):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert server.returncode == 0, server_log[-3000:]
    assert all(c.returncode == 0 for c in clients), "\n".join(log[-2000:] for log in logs)
    return out


def test_flower_fedavg_over_edgerun_clients_equals_edgerun_own_rounds(tmp_path: Path) -> None:
    model, _, initial = digits_model(seed=SEED, lr=0.5)
    names = model.trainable
    shards, _ = digits_split(CLIENTS, seed=SEED)
    task = write_training_task(tmp_path / "task", "digits", model, initial, epochs=1)
    data = []
    for i, (images, labels) in enumerate(shards):
        data.append(tmp_path / f"device-{i}.npz")
        np.savez(data[-1], images=images, labels=labels)
    out = _flower_federation(tmp_path, names, initial, data, task)

    # edgerun's own job: every device each round, each trained from the round's global weights by the seeds
    engine = database.create_engine(database.sqlite_url(tmp_path))
    database.upgrade(engine)
    job = FederatedJob.start(engine, JobConfig("digits", rounds=ROUNDS, per_round=CLIENTS, quorum=CLIENTS,
                                               seed=SEED, max_drop=1.0), initial, tmp_path / "updates")
    phones = [DeviceProfile(f"phone-{i}") for i in range(CLIENTS)]
    history = json.loads((out / "history.json").read_text())
    for r in range(1, ROUNDS + 1):
        start = job.global_weights()
        for device in job.open_round(phones, now=float(r)):
            delta, n = local_update(model, start, *shards[int(device.split("-")[1])], epochs=1, seed=(SEED, r))
            assert job.receive(device, r, pack_update(delta), n, now=float(r)) == "accepted"
        assert job.close_round(evaluate=lambda w: 0.0, publish=lambda v, w: None).outcome == "published"
        ours = job.global_weights()
        with np.load(out / f"round-{r}.npz") as archive:
            flower = {name: archive[f"arr_{k}"] for k, name in enumerate(names)}
        for name in names:
            assert not np.allclose(ours[name], start[name])  # the round trained something
            np.testing.assert_allclose(flower[name], ours[name], rtol=1e-5, atol=1e-6, err_msg=name)

        # Flower's evaluation of round r: the sample-weighted mean of each client's loss over its full batches
        model.loaded.set_state(**ours)
        losses, counts, right = [], [], 0
        for images, labels in shards:
            full = len(labels) - len(labels) % BATCH
            losses.append(np.mean([model.evaluate(images[i:i + BATCH], labels[i:i + BATCH])
                                   for i in range(0, full, BATCH)]))
            right += sum(int(np.sum(np.asarray(model.forward(images[i:i + BATCH])).argmax(axis=1) == labels[i:i + BATCH]))
                         for i in range(0, full, BATCH))
            counts.append(full)
        [loss] = [entry[1] for entry in history["losses"] if entry[0] == r]
        [accuracy] = [entry[1] for entry in history["accuracy"] if entry[0] == r]
        assert loss == pytest.approx(np.average(losses, weights=counts), rel=1e-5)
        assert accuracy == pytest.approx(right / sum(counts), rel=1e-9)
    engine.dispose()


def test_a_client_with_unreadable_data_fails_in_one_line(tmp_path: Path) -> None:
    model, _, initial = digits_model(seed=SEED)
    task = write_training_task(tmp_path / "task", "digits", model, initial)
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    run = subprocess.run([str(FLOWER_PYTHON), "-m", "edgerun.fleet.federated.flower_client", "--server",
                          "127.0.0.1:1", "--task", str(task), "--data", str(tmp_path / "bad.npz")],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr
