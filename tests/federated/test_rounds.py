"""Federated rounds on the server, over a real SQLite fleet database: sampling by targeting, quorum and
deadline on an injected clock, stragglers, refused and repeated updates, a restart between and inside
rounds, and the held-out check that rolls a round back (publishing through a real fleet server is in
test_federation.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgerun.fleet import database
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated import fedavg, pack_update
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
from edgerun.fleet.targeting import DeviceProfile

INITIAL = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
PHONES = [DeviceProfile(f"phone-{i}", device_groups=("beta",) if i < 6 else ()) for i in range(8)]


def delta(round_number: int, device: str, scale: float = 0.1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([round_number, int(device.split("-")[1])])
    return {n: (scale * rng.standard_normal(a.shape)).astype(np.float32) for n, a in INITIAL.items()}


def make_job(tmp_path: Path, **config: object) -> tuple[FederatedJob, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    url = database.sqlite_url(tmp_path)
    settings = dict(name="digits", rounds=3, per_round=4, quorum=3, deadline_s=60.0,
                    targeting={"kind": "device_group", "values": ["beta"]}, norm_bound=2.0, seed=5)
    settings.update(config)
    engine = database.create_engine(url)
    database.upgrade(engine)  # the fleet's migrations, as the server runs them at start
    return FederatedJob.start(engine, JobConfig(**settings), INITIAL, tmp_path / "updates"), url


def test_a_round_with_faults_aggregates_each_good_update_once_and_survives_a_restart(tmp_path: Path) -> None:
    job, url = make_job(tmp_path)
    sampled = job.open_round(PHONES, now=100.0)
    assert len(sampled) == 4 and all(int(d.split("-")[1]) < 6 for d in sampled)  # targeting: the beta group
    assert job.open_round(PHONES, now=101.0) == sampled  # reopening returns the open round's sample
    honest, nan_device, straggler = sampled[:2], sampled[2], sampled[3]
    outsider = next(p.device_id for p in PHONES if p.device_id not in sampled)
    assert job.receive(honest[0], 1, pack_update(delta(1, honest[0])), 30, now=110.0) == "accepted"
    assert job.receive(honest[0], 1, pack_update(delta(1, honest[0])), 30, now=111.0) == "duplicate"
    poisoned = delta(1, nan_device)
    poisoned["w"][0, 0] = np.nan
    assert job.receive(nan_device, 1, pack_update(poisoned), 10, now=112.0) == "not_finite"
    assert job.receive(outsider, 1, pack_update(delta(1, outsider)), 10, now=112.0) == "not_sampled"

    job = FederatedJob(database.create_engine(url), "digits", tmp_path / "updates")  # a restart inside the round
    assert job.receive(nan_device, 1, pack_update(delta(1, nan_device)), 10, now=113.0) == "duplicate"
    assert job.receive(honest[1], 1, pack_update(delta(1, honest[1]), "int8"), 50, now=114.0) == "accepted"
    assert not job.ready(now=150.0)  # two accepted of a quorum of three, deadline at 160
    assert job.ready(now=160.0)
    assert job.receive(straggler, 1, pack_update(delta(1, straggler)), 10, now=161.0) == "round_closed"
    published: list[int] = []
    result = job.close_round(evaluate=lambda w: 0.5, publish=lambda v, w: published.append(v))
    assert (result.outcome, result.version, result.participants, result.samples) == ("published", 2, 2, 80)
    assert result.refused == {"not_finite": 1} and result.duplicates == 2 and result.stragglers == 1
    assert published == [2]
    int8 = {n: np.asarray(a) for n, a in pack_update(delta(1, honest[1]), "int8").items()}
    restored = {n: int8[f"{n}.q"].astype(np.float32) * np.float32(int8[f"{n}.scale"]) for n in INITIAL}
    expect = fedavg(INITIAL, [(honest[0], delta(1, honest[0]), 30), (honest[1], restored, 50)])
    job = FederatedJob(database.create_engine(url), "digits", tmp_path / "updates")  # a restart between rounds
    for name in INITIAL:
        np.testing.assert_allclose(job.global_weights()[name], expect[name], rtol=1e-6, atol=1e-7)
    status = job.status()
    assert (status["round"], status["version"], status["best_metric"]) == (2, 2, 0.5)
    assert status["rounds"][0]["refused"] == {"not_finite": 1}
    assert job.receive(honest[0], 1, pack_update(delta(1, honest[0])), 30, now=170.0) == "round_closed"


def test_a_round_whose_held_out_metric_drops_is_rolled_back(tmp_path: Path) -> None:
    job, _ = make_job(tmp_path, quorum=1, max_drop=0.05)
    metrics = iter([0.80, 0.70, 0.78])  # round 2 drops 0.10 below the best: rolled back
    published: list[int] = []
    outcomes = []
    for r in (1, 2, 3):
        device = job.open_round(PHONES, now=float(r))[0]
        assert job.receive(device, r, pack_update(delta(r, device)), 20, now=float(r)) == "accepted"
        assert job.ready(now=float(r))
        before = job.global_weights()
        result = job.close_round(evaluate=lambda w: next(metrics), publish=lambda v, w: published.append(v))
        outcomes.append((result.outcome, result.version))
        if result.outcome == "rolled_back":
            assert all(np.array_equal(job.global_weights()[n], before[n]) for n in INITIAL)
    assert outcomes == [("published", 2), ("rolled_back", 2), ("published", 3)]
    assert published == [2, 3]
    assert job.status()["status"] == "done"
    with pytest.raises(FleetError, match="is done"):
        job.open_round(PHONES, now=10.0)


def test_bad_job_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="quorum"):
        JobConfig(name="x", per_round=2, quorum=3)
    with pytest.raises(FleetError, match="targeting kind"):
        JobConfig(name="x", targeting={"kind": "everyone"})
    make_job(tmp_path)
    with pytest.raises(FleetError, match="already exists"):
        make_job(tmp_path)
    job, _ = make_job(tmp_path / "other", targeting={"kind": "device", "values": ["tablet-1"]})
    with pytest.raises(FleetError, match="no device matches"):
        job.open_round(PHONES, now=0.0)


def test_the_collector_hands_each_stream_record_to_the_job_once(tmp_path: Path) -> None:
    from edgerun.fleet.federated.collector import collect
    from edgerun.fleet.federated.training_task import encode_arrays

    job, url = make_job(tmp_path, quorum=2)
    a, b = job.open_round(PHONES, now=0.0)[:2]

    def record(device: str, rid: str, update: dict[str, np.ndarray] | None) -> dict[str, object]:
        payload = {"job": "digits", "round": 1, "samples": 12,
                   "update": encode_arrays(pack_update(update)) if update is not None else "not base64!"}
        return {"device_id": device, "record_id": rid, "task_id": "digits", "payload": payload}

    records = [record(a, "federated:digits:1", delta(1, a)), record(b, "junk", None)]
    assert collect(job, records, now=1.0) == {"accepted": 1, "malformed": 1}
    again = FederatedJob(database.create_engine(url), "digits", tmp_path / "updates")  # the collector restarted
    records.append(record(a, "federated:digits:1-resent", delta(1, a)))  # the same round's update again
    assert collect(again, records, now=2.0) == {"duplicate": 1}
    assert collect(again, records, now=3.0) == {}


def test_a_job_with_noise_reports_its_privacy_spent(tmp_path: Path) -> None:
    from edgerun.fleet.federated import gaussian_epsilon

    job, _ = make_job(tmp_path, quorum=1, clip=0.5, noise_multiplier=1.1, norm_bound=None, max_drop=1.0)
    assert job.status()["privacy"]["epsilon"] == 0.0
    for r in (1, 2):
        device = job.open_round(PHONES, now=float(r))[0]
        job.receive(device, r, pack_update(delta(r, device, scale=1.0)), 20, now=float(r))
        before = job.global_weights()
        job.close_round(evaluate=lambda w: 0.5)
        moved = {n: job.global_weights()[n] - before[n] for n in INITIAL}
        # the update alone moves it by its clipped norm, 0.5; the noise (std 0.55 on each of 15 entries) by ~2
        assert np.sqrt(sum(float(np.sum(m * m)) for m in moved.values())) > 1.0
    privacy = job.status()["privacy"]
    assert privacy["rounds"] == 2 and privacy["epsilon"] == gaussian_epsilon(1.1, 2, 1e-5)


def test_two_collectors_at_once_leave_every_update_in_the_running_sum_once(tmp_path: Path) -> None:
    """A collector whose updates another process recorded around (a second collector, or one started again
    while the first was still at it) fails in one line, records nothing and leaves no file; the sum the
    other committed stays whole, and the loser's updates are taken when offered again."""
    from edgerun.fleet.federated.rounds import Offer

    job, url = make_job(tmp_path, quorum=2)
    a, b = job.open_round(PHONES, now=0.0)[:2]
    other = FederatedJob(database.create_engine(url), "digits", tmp_path / "updates")

    def offers():  # type: ignore[no-untyped-def]
        yield Offer(a, 1, pack_update(delta(1, a)), 30)
        assert other.receive(b, 1, pack_update(delta(1, b)), 10, now=2.0) == "accepted"  # commits meanwhile

    with pytest.raises(FleetError, match="changed while these updates were taken"):
        job.receive_many(offers(), now=1.0)
    round_dir = tmp_path / "updates" / "digits" / "1"
    assert len(list(round_dir.glob("sum-*"))) == 1  # the loser's file is gone, the winner's intact
    assert job.receive(a, 1, pack_update(delta(1, a)), 30, now=3.0) == "accepted"
    assert job.receive(b, 1, pack_update(delta(1, b)), 10, now=3.0) == "duplicate"
    assert len(list(round_dir.glob("sum-*"))) == 1
    result = job.close_round(evaluate=lambda w: 1.0)
    assert (result.participants, result.samples, result.duplicates) == (2, 40, 1)
    expect = fedavg(INITIAL, [(a, delta(1, a), 30), (b, delta(1, b), 10)])
    for name in INITIAL:
        np.testing.assert_allclose(job.global_weights()[name], expect[name], rtol=1e-6, atol=1e-7)
    assert not round_dir.exists()
