"""Push across replicas: a publish through one replica reaches the push streams held by another through
PostgreSQL NOTIFY (that replica's poll is an hour), and only the streams the release targets are looked at;
a revoke through one replica reaches the other's identity cache the same way."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import httpx
import pytest
from fleet_helpers import FAILING_BODY, FleetServer, make_task, start_server

from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.push_channel import OpenStream, StreamIndex, concerned
from edgerun.fleet.service import CachedRelease, DeviceIdentity
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile, device_bucket, in_step, release_offset

pytestmark = pytest.mark.xdist_group("fleet-push-replicas")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def listen(server: FleetServer, device_id: str, token: str, events: queue.Queue[str]) -> threading.Thread:
    """A device's push stream, read on a thread; each `event:` line goes to `events`."""
    def run() -> None:
        try:
            with httpx.stream("GET", f"{server.url}/v1/devices/{device_id}/events",
                              headers={"Authorization": f"Bearer {token}"}, timeout=None) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        events.put(line[7:])
        except httpx.HTTPError:
            pass
        events.put("closed")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.postgres
def test_a_publish_through_one_replica_nudges_only_the_targeted_streams_on_another(postgres: LocalPostgres,
                                                                                    tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    url = postgres.create_database("push_replicas")
    a = start_server(tmp_path / "a", keys, db_url=url)
    b = start_server(tmp_path / "b", keys, "--push-poll", "3600", "--store", str(a.data / "blobs"), db_url=url)
    try:
        agents = [b.agent(f"push-{i}", tmp_path / f"push-{i}") for i in range(3)]
        for agent in agents:
            agent.check_in()
        events = [queue.Queue[str]() for _ in agents]
        for agent, q in zip(agents, events):
            listen(b, agent.device_id, agent.token, q)
        assert [q.get(timeout=120) for q in events] == ["hello"] * 3  # all three streams are open on b
        a.admin().publish(make_task(tmp_path, "pushed", 2, targeting={"kind": "device", "values": ["push-0"]}),
                          keys, {"steps": [100], "min_reports": 1})
        assert events[0].get(timeout=120) == "changed"  # through NOTIFY: b's own poll is an hour away
        scraped = httpx.get(b.url + "/metrics").text
        assert metric(scraped, "edgerun_fleet_push_checks_total") == 1  # push-1, push-2 were never looked at
        assert metric(scraped, "edgerun_fleet_push_nudges_total") == 1
        agents[0].check_in()
        assert agents[0].profile().tasks["pushed"] == 2
        assert all(q.empty() for q in events[1:])
        # A revoke through A reaches B's identity cache (ten minutes there on PostgreSQL) through NOTIFY too.
        headers = {"Authorization": f"Bearer {agents[1].token}"}
        assert httpx.get(f"{b.url}/v1/devices/push-1/assignment", headers=headers).status_code == 200
        a.admin().revoke_device("push-1")
        for _ in range(1200):
            if httpx.get(f"{b.url}/v1/devices/push-1/assignment", headers=headers).status_code == 403:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("replica B kept accepting a token revoked through replica A")
    finally:
        b.stop()
        a.stop()


def test_the_rollback_of_a_first_release_is_pushed_to_the_devices_that_took_it(tmp_path: Path) -> None:
    """A task's first release, rolled back, is removed again (nothing to return to). The device took it
    from the answer to a check-in, so the profile its stream holds (that check-in's) does not show the task;
    the removal still reaches it through the stream, not at its fallback poll minutes later."""
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path, keys)
    try:
        agent = server.agent("first-rb", tmp_path / "first-rb")
        agent.check_in()
        events = queue.Queue[str]()
        listen(server, agent.device_id, agent.token, events)
        assert events.get(timeout=120) == "hello"
        server.admin().publish(make_task(tmp_path, "firstrb", 1, FAILING_BODY,
                                         targeting={"kind": "device", "values": ["first-rb"]}),
                               keys, {"steps": [100], "min_reports": 5, "error_min_reports": 1})
        assert events.get(timeout=120) == "changed"
        assert agent.check_in() is True and agent.profile().tasks["firstrb"] == 1
        assert agent.run_task("firstrb").outcome == "failure"
        assert agent.flush_reports() == 1  # the breach: rolled back to the task's removal
        assert events.get(timeout=120) == "changed"
        assert agent.check_in() is True and "firstrb" not in agent.profile().tasks
    finally:
        server.stop()


def test_a_gray_step_concerns_exactly_the_open_streams_in_its_bucket_range() -> None:
    index = StreamIndex()
    streams = [index.open(DeviceIdentity(f"idx-{i}", ()), DeviceProfile(f"idx-{i}")) for i in range(2000)]
    for s in streams[::7]:
        index.close(s)  # closed streams are gone from both indexes
    open_ids = {s.owner.device_id for i, s in enumerate(streams) if i % 7}

    def release(stage: str, exposure: float, kind: str = "uniform") -> CachedRelease:
        return CachedRelease(1, "idx", 3, {}, {}, {"kind": kind, "values": ["idx-1", "idx-7"]}, stage, exposure,
                             True, frozenset({"idx-2"}), release_offset("idx", 3))

    def ids(found: list[OpenStream]) -> set[str]:
        return {s.owner.device_id for s in found}

    five = ids(concerned(index, release("gray", 1.0), release("gray", 5.0)))
    assert five == {d for d in open_ids if in_step(device_bucket(d), release_offset("idx", 3), 5.0)} | {"idx-2"}
    assert 40 < len(five) < 160  # about 5% of 1,714
    # A rollback reaches the window the release had reached; a device-targeted release, the ids it names.
    assert ids(concerned(index, release("gray", 5.0), release("rolled_back", 0.0))) == five
    assert ids(concerned(index, None, release("gray", 5.0, kind="device"))) == {"idx-1", "idx-2"}
    assert ids(concerned(index, release("gray", 50.0), release("completed", 100.0))) == open_ids
