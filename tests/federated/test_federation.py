"""End to end with real agents: a loopback fleet server, device agents training the digits MLP in their
compute containers, updates through the stream tunnel, each round published as a signed release. Each
round's global weights equal FedAvg computed directly in numpy from the same seeds and data, with a device
sending a 100x update and one sending its update twice. (The issue's
full run, 8 devices and 10 rounds to >= 90% held-out accuracy, is bench/federated.py: minutes of CPU.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgerun.fleet.federated.demo import JOB, run_federated
from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg
from edgerun.fleet.federated.publisher import WEIGHTS_NAME, release_version
from edgerun.fleet.package import read_package
from edgerun.training import read_weights


def test_rounds_through_real_agents_equal_a_direct_numpy_fedavg_despite_faults(tmp_path: Path) -> None:
    lines: list[str] = []
    # device 1 uploads 100 times its update (refused by the norm bound), device 2 uploads its update twice
    run = run_federated(devices=3, rounds=1, epochs=1, lr=0.5, server_lr=2.0, seed=3, work=tmp_path / "work",
                        faults={1: "huge", 2: "twice"}, out=lines.append)
    [result] = run.results
    assert (result.outcome, result.participants, result.refused, result.duplicates, result.stragglers) == (
        "published", 2, {"norm_exceeded": 1}, 1, 0)
    shards, _ = digits_split(3, seed=3)
    assert run.honest == [[0, 2]] and result.samples == len(shards[0][1]) + len(shards[2][1])
    assert any(line.split()[:5] == ["1", "3", "2", "1", "1"] for line in lines)  # round, sampled, applied,
                                                                                # refused, duplicates
    model, _, initial = digits_model(seed=3, lr=0.5)
    [expect] = direct_fedavg(model, initial, shards, run.honest, seed=3, epochs=1, server_lr=2.0)
    for name, array in expect.items():
        np.testing.assert_allclose(run.weights[0][name], array, rtol=1e-5, atol=1e-6)
        assert not np.allclose(array, initial[name])

    package = read_package(tmp_path / "work" / "packages" / f"{JOB}-v{release_version(2)}.tar")
    (tmp_path / WEIGHTS_NAME).write_bytes(package.blobs[{f.path: f.sha256 for f in package.files}[WEIGHTS_NAME]])
    shipped = read_weights(tmp_path / WEIGHTS_NAME)  # what the devices receive for the next round
    assert all(np.array_equal(shipped[n], run.weights[0][n]) for n in expect)
