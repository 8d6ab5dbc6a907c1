"""Updates larger than a tunnel batch, through a real fleet server on loopback and real enrolled agents: they go
up in parts (stream/large_records.py) with the device's token, arrive intact, are collected page by page into
the round's running sum, and a device killed mid-upload resumes without sending a kept part again or storing
the record twice; a corrupted part, a part of the wrong length and a whole that does not hash to what was
declared are refused with a counted reason. The cap is lowered on the device (64 KiB batches, 40 KiB parts)
to keep this cheap; bench/federated.py --large-round sends MiniLM-sized updates at the real 16 MiB cap."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from edgerun.fleet import database
from edgerun.fleet.federated.collector import StreamRecords, collect
from edgerun.fleet.federated.compression import pack_update
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
from edgerun.fleet.federated.training_task import encode_arrays, record_id
from edgerun.fleet.local_server import FleetServer, start_server
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile
from edgerun.stream.agent_hooks import StreamHooks
from edgerun.stream.cloud import stream_parts, stream_records
from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Backoff, Uploader, payload_bytes

REPO = Path(__file__).resolve().parents[2]
CAP, PART = 64 * 1024, 40 * 1024
SHAPES = {"fc.weight": (150, 200), "fc.bias": (150,)}  # 120 KB of float32: about 160 KB of base64 npz


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    base = tmp_path_factory.mktemp("large")
    keys = KeyDir(base / "keys")
    keys.init()
    fleet = start_server(base / "server", keys)
    yield fleet
    fleet.stop()


def _delta(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.01, shape).astype(np.float32) for name, shape in SHAPES.items()}


def _stats(server: FleetServer) -> dict[str, object]:
    r = httpx.get(server.url + "/v1/stream/stats", headers={"Authorization": f"Bearer {server.admin_token}"})
    return dict(r.json())


def test_updates_over_the_cap_arrive_intact_and_are_summed_as_collected(server: FleetServer, tmp_path: Path) -> None:
    job_name = "large-sum"
    initial = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    engine = database.create_engine(database.sqlite_url(server.data))
    job = FederatedJob.start(engine, JobConfig(job_name, rounds=1, per_round=3, quorum=3, deadline_s=600),
                             initial, tmp_path / "updates")
    devices = job.open_round([DeviceProfile(f"big-{i}") for i in range(3)], now=0.0)
    samples = {"big-0": 10, "big-1": 30, "big-2": 20}
    for i, device in enumerate(devices):
        agent = server.agent(device, tmp_path / device)
        agent.step()  # enrols: the tunnel uses the device's own token
        hooks = StreamHooks.for_agent(agent, backoff=Backoff(0.01, 0.05), max_batch_bytes=CAP, part_bytes=PART)
        output = {"job": job_name, "round": 1, "samples": samples[device], "update": encode_arrays(pack_update(_delta(i)))}
        assert len(json.dumps(output)) > 2 * CAP
        hooks.pipeline.store_output(job_name, output, record_id=record_id(job_name, 1))
        assert hooks.pipeline.flush() == 1
        assert hooks.pipeline.uploader is not None and hooks.pipeline.uploader.parts_sent >= 4
        hooks.close()

    records = StreamRecords(server.url, server.admin_token, job_name, page_records=2)  # two pages and an end
    listed = list(records)
    assert sorted(r["device_id"] for r in listed) == devices
    assert all(set(r["payload"]) == {"$large"} for r in listed)  # a reference, not the payload
    assert collect(job, records, now=1.0) == {"accepted": 3}
    assert collect(job, records, now=2.0) == {}  # each record handed over once
    assert len(list((tmp_path / "updates" / job_name / "1").glob("sum-*"))) == 1  # the older page's removed

    result = job.close_round(evaluate=lambda w: 1.0)
    assert (result.participants, result.samples) == (3, 60)
    total = sum(samples.values())
    for name in SHAPES:
        expect = sum(samples[d] * _delta(i)[name].astype(np.float64) for i, d in enumerate(devices)) / total
        np.testing.assert_allclose(job.global_weights()[name], expect.astype(np.float32), rtol=1e-6, atol=1e-9)
    assert not (tmp_path / "updates" / job_name / "1").exists()
    engine.dispose()


CHILD = """
import os, signal, sys
from pathlib import Path
from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Uploader
store_path, url, device, token_path, cap, part = sys.argv[1:]
uploader = Uploader(CollectiveStore(Path(store_path)), url, device, Path(token_path).read_text().strip(),
                    max_batch_bytes=int(cap), part_bytes=int(part),
                    after_part=lambda index: os.kill(os.getpid(), signal.SIGKILL) if index == 2 else None)
uploader.upload_all()
"""


def test_a_device_killed_mid_upload_resumes_without_resending_or_duplicating(server: FleetServer,
                                                                             tmp_path: Path) -> None:
    agent = server.agent("resumer", tmp_path / "agent")
    agent.step()
    token = tmp_path / "token"
    token.write_text(agent.token)
    store_path = tmp_path / "outputs.db"
    store = CollectiveStore(store_path, flush_threshold=1)
    payload = {"round": 1, "samples": 5, "update": encode_arrays(_delta(7))}
    store.put("resume-job", payload, record_id="federated:resume-job:1")
    store.close()
    parts = -(-len(payload_bytes(CollectiveStore(store_path).pending_batch(1)[0])) // PART)

    child = subprocess.run([sys.executable, "-c", CHILD, str(store_path), server.url + "/v1/stream", "resumer",
                            str(token), str(CAP), str(PART)], cwd=REPO, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode == -9, child.stderr  # killed after the cloud kept parts 0, 1 and 2
    before = _stats(server)

    store = CollectiveStore(store_path)  # the agent started again: the record is still pending
    uploader = Uploader(store, server.url + "/v1/stream", "resumer", agent.token, max_batch_bytes=CAP,
                        part_bytes=PART, backoff=Backoff(0.01, 0.05))
    assert uploader.upload_all() == 1
    assert uploader.parts_sent == parts - 3  # only the parts the cloud lacked
    assert store.pending_count() == 0
    after = _stats(server)
    assert after["records"] == before["records"] + 1  # type: ignore[operator]

    [record] = [r for r in StreamRecords(server.url, server.admin_token, "resume-job")]
    assert json.loads(json.dumps(StreamRecords(server.url, server.admin_token, "resume-job").payload(record))) == payload
    # sent again (a lost answer): the cloud says it holds it, no part goes up, nothing is stored twice
    uploader.send_large(store.read("resume-job")[0])
    assert uploader.parts_sent == parts - 3 and _stats(server)["records"] == after["records"]
    uploader.close()
    store.close()


def test_corrupted_parts_and_a_wrong_whole_are_refused_with_a_counted_reason(server: FleetServer,
                                                                              tmp_path: Path) -> None:
    agent = server.agent("corrupter", tmp_path / "agent")
    agent.step()
    other = server.agent("bystander", tmp_path / "other")
    other.step()
    url = server.url + "/v1/stream/large"
    data = json.dumps({"round": 1, "samples": 3, "update": "A" * 100_000}).encode()
    key = {"device_id": "corrupter", "record_id": "federated:corrupt:1"}
    start = {**key, "task_id": "corrupt", "created_ms": 1, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "part_bytes": PART}
    auth = {"Authorization": f"Bearer {agent.token}"}
    before = dict(_stats(server)["refused"])  # type: ignore[call-overload]

    assert httpx.post(url, json=start, headers=auth).json() == {"state": "open", "have": []}
    assert httpx.post(url, json=start, headers={"Authorization": f"Bearer {other.token}"}).status_code == 403
    part0 = data[:PART]
    bad = httpx.put(f"{url}/parts/0", params=key, content=part0[:-1] + b"!",
                    headers={**auth, "X-Part-Sha256": hashlib.sha256(part0).hexdigest()})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("part_checksum")
    short = httpx.put(f"{url}/parts/0", params=key, content=part0[:100],
                      headers={**auth, "X-Part-Sha256": hashlib.sha256(part0[:100]).hexdigest()})
    assert short.status_code == 422 and short.json()["detail"].startswith("part_length")
    assert httpx.post(url + "/complete", json=key, headers=auth).status_code == 409  # parts missing

    # parts that each hash right but do not make the payload declared: refused whole, parts dropped
    lie = {**start, "sha256": hashlib.sha256(b"something else").hexdigest()}
    assert httpx.post(url, json=lie, headers=auth).json()["have"] == []
    for index in range(-(-len(data) // PART)):
        part = data[index * PART:(index + 1) * PART]
        assert httpx.put(f"{url}/parts/{index}", params=key, content=part,
                         headers={**auth, "X-Part-Sha256": hashlib.sha256(part).hexdigest()}).status_code == 200
    wrong = httpx.post(url + "/complete", json=key, headers=auth)
    assert wrong.status_code == 422 and wrong.json()["detail"].startswith("payload_checksum")
    refused = _stats(server)["refused"]
    assert {k: v - before.get(k, 0) for k, v in refused.items()} == {  # type: ignore[attr-defined]
        "part_checksum": 1, "part_length": 1, "payload_checksum": 1}

    # the device's own uploader then delivers the record whole
    store = CollectiveStore(tmp_path / "outputs.db", flush_threshold=1)
    store.put("corrupt", json.loads(data), record_id=key["record_id"])
    uploader = Uploader(store, server.url + "/v1/stream", "corrupter", agent.token, max_batch_bytes=CAP,
                        part_bytes=PART)
    assert uploader.upload_all() == 1 and uploader.parts_sent == -(-len(data) // PART)
    [record] = list(StreamRecords(server.url, server.admin_token, "corrupt"))
    assert StreamRecords(server.url, server.admin_token, "corrupt").payload(record) == json.loads(data)
    uploader.close()
    store.close()


def _restart(server: FleetServer) -> None:
    """The same server again: same port, data folder, keys and token files, a new process."""
    server.proc.terminate()
    server.proc.wait(30)
    port, base = server.url.rsplit(":", 1)[1], server.log.parent
    with open(server.log, "ab") as out:
        server.proc = subprocess.Popen(
            [sys.executable, "-m", "edgerun", "fleet", "serve", "--port", port, "--data", str(server.data),
             "--keys", str(server.keys.path), "--admin-token-file", str(base / f"admin-{port}"),
             "--enroll-token-file", str(base / f"enroll-{port}")], stdout=out, stderr=subprocess.STDOUT,
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    for _ in range(1200):
        try:
            if httpx.get(server.url + "/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert server.proc.poll() is None, server.log.read_text()[-2000:]
        time.sleep(0.1)
    raise AssertionError("the restarted server did not answer")


def test_a_server_restarted_mid_upload_and_between_rounds(server: FleetServer, tmp_path: Path) -> None:
    """The fleet server stops while a device is between two parts (its connection drops), and again between
    rounds: the upload resumes against the restarted server without resending a kept part, and both rounds
    close with exact counts and the weights of a direct mean, nothing applied twice."""
    initial = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    job_name = "restarts"
    engine = database.create_engine(database.sqlite_url(server.data))
    job = FederatedJob.start(engine, JobConfig(job_name, rounds=2, per_round=2, quorum=2, deadline_s=600),
                             initial, tmp_path / "updates")
    agents = {d: server.agent(d, tmp_path / d) for d in ("r-0", "r-1")}
    for agent in agents.values():
        agent.step()
    stops: list[int] = []

    def stop_once(index: int) -> None:
        if index == 1 and not stops:
            stops.append(index)
            server.proc.terminate()
            server.proc.wait(30)

    expect = dict(initial)
    for round_number in (1, 2):
        assert job.open_round([DeviceProfile(d) for d in agents], now=float(round_number)) == sorted(agents)
        deltas = {d: _delta(10 * round_number + i) for i, d in enumerate(agents)}
        for device, agent in agents.items():
            store = CollectiveStore(tmp_path / device / f"outputs-{round_number}.db", flush_threshold=1)
            store.put(job_name, {"job": job_name, "round": round_number, "samples": 10,
                                 "update": encode_arrays(pack_update(deltas[device]))},
                      record_id=record_id(job_name, round_number))
            parts = -(-len(payload_bytes(store.pending_batch(1)[0])) // PART)
            uploader = Uploader(store, server.url + "/v1/stream", device, lambda a=agent: a.token,
                                max_batch_bytes=CAP, part_bytes=PART, backoff=Backoff(0.01, 0.05),
                                after_part=stop_once if device == "r-0" else None)
            if device == "r-0" and round_number == 1:
                assert uploader.upload_ready() == 0  # the connection dropped after part 1 was kept
                assert uploader.parts_sent == 2 and store.pending_count() == 1
                _restart(server)
            assert uploader.upload_all(timeout_s=60) == 1
            assert uploader.parts_sent == parts  # each part sent once, across the restart
            uploader.close()
            store.close()
        verdicts = collect(job, StreamRecords(server.url, server.admin_token, job_name), now=float(round_number))
        assert verdicts == {"accepted": 2}  # round 1's records were handed over before the restart
        result = job.close_round(evaluate=lambda w: 1.0)
        assert (result.participants, result.duplicates, result.refused, result.stragglers) == (2, 0, {}, 0)
        expect = {n: (expect[n].astype(np.float64) + np.mean([deltas[d][n] for d in agents], axis=0,
                                                             dtype=np.float64)).astype(np.float32)
                  for n in SHAPES}
        for name in SHAPES:
            np.testing.assert_allclose(job.global_weights()[name], expect[name], rtol=1e-6, atol=1e-8)
        if round_number == 1:
            _restart(server)  # between rounds, and the job's process anew
            job = FederatedJob(database.create_engine(database.sqlite_url(server.data)), job_name,
                               tmp_path / "updates")
    assert stops == [1]
    assert job.status()["status"] == "done"


def _held(engine: sa.Engine, job_name: str, devices: list[str]) -> tuple[int, int, int]:
    """The job's records in the fleet database: rows, payload bytes, and the bytes of its devices' parts."""
    with engine.connect() as conn:
        rows, payload = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(
            sa.func.length(stream_records.c.payload)), 0)).where(stream_records.c.task_id == job_name)).one()
        parts = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(sa.func.length(stream_parts.c.data)), 0))
                             .where(stream_parts.c.device_id.in_(devices))).scalar_one()
    return int(rows), int(payload), int(parts)


def test_collected_records_leave_the_store_once_recorded_and_a_tick_reads_only_new_ones(
        server: FleetServer, tmp_path: Path) -> None:
    """Each page's records and the parts of its large updates leave the fleet database once the job has
    recorded them; the server stopped between that commit and the removal leaves them for the next tick,
    which removes them without offering them again; each later tick reads only the records new since."""
    job_name = "prune"
    initial = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    engine = database.create_engine(database.sqlite_url(server.data))
    job = FederatedJob.start(engine, JobConfig(job_name, rounds=2, per_round=3, quorum=3, deadline_s=600),
                             initial, tmp_path / "updates")
    devices = [f"p-{i}" for i in range(3)]
    agents = {d: server.agent(d, tmp_path / d) for d in devices}
    for agent in agents.values():
        agent.step()

    def upload(device: str, round_number: int, delta: dict[str, np.ndarray]) -> None:
        hooks = StreamHooks.for_agent(agents[device], backoff=Backoff(0.01, 0.05), max_batch_bytes=CAP,
                                      part_bytes=PART)
        hooks.pipeline.store_output(job_name, {"job": job_name, "round": round_number, "samples": 10,
                                               "update": encode_arrays(pack_update(delta))},
                                    record_id=record_id(job_name, round_number))
        assert hooks.pipeline.flush() == 1
        hooks.close()

    stops: list[int] = []

    def stop(verdicts: object) -> None:  # p-0's page is committed; the server goes before the removal
        if not stops:
            stops.append(1)
            server.proc.terminate()
            server.proc.wait(30)

    expect = dict(initial)
    for round_number in (1, 2):
        assert job.open_round([DeviceProfile(d) for d in devices], now=float(round_number)) == devices
        deltas = {d: _delta(100 * round_number + i) for i, d in enumerate(devices)}
        upload("p-0", round_number, deltas["p-0"])
        upload("p-1", round_number, deltas["p-1"])
        assert _held(engine, job_name, devices)[2] > 2 * CAP  # both updates came in parts

        records = StreamRecords(server.url, server.admin_token, job_name, page_records=1)
        if round_number == 1:
            with pytest.raises(httpx.ConnectError):
                collect(job, records, now=float(round_number), on_page=stop)
            assert _held(engine, job_name, devices)[0] == 2  # recorded, not removed
            _restart(server)
            records = StreamRecords(server.url, server.admin_token, job_name, page_records=1)
            assert collect(job, records, now=float(round_number)) == {"accepted": 1}  # p-1 only: p-0 was taken
        else:
            assert collect(job, records, now=float(round_number)) == {"accepted": 2}
        assert records.read == 2 and records.removed["records"] == 2 and records.removed["parts"] > 0
        assert _held(engine, job_name, devices) == (0, 0, 0)

        upload("p-2", round_number, deltas["p-2"])
        records = StreamRecords(server.url, server.admin_token, job_name)
        assert collect(job, records, now=float(round_number)) == {"accepted": 1}
        assert records.read == 1  # the new record only
        records = StreamRecords(server.url, server.admin_token, job_name)
        assert collect(job, records, now=float(round_number)) == {} and records.read == 0
        assert _held(engine, job_name, devices) == (0, 0, 0)

        result = job.close_round(evaluate=lambda w: 1.0)
        assert (result.participants, result.duplicates, result.refused) == (3, 0, {})
        expect = {n: (expect[n].astype(np.float64) + np.mean([deltas[d][n] for d in devices], axis=0,
                                                             dtype=np.float64)).astype(np.float32)
                  for n in SHAPES}
        for name in SHAPES:
            np.testing.assert_allclose(job.global_weights()[name], expect[name], rtol=1e-6, atol=1e-8)
    assert job.status()["status"] == "done" and stops == [1]
    engine.dispose()
