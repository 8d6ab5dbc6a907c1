"""Each server process re-reads the trust root, the admin token's hash and the release table every period (another
replica may have changed them). Those re-reads run in worker threads, never on the event loop: while the
database is slow to answer them, a device the process holds is still answered (with what it holds), instead
of every request of the process waiting for the database."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fleet_helpers import Clock

from edgerun.fleet.refreshed import Refreshed
from edgerun.fleet.server import ServerConfig, create_app
from edgerun.fleet.service import ROOT_TTL_S
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile

pytestmark = pytest.mark.xdist_group("fleet-operations")

GIVE_UP_S = 10.0  # only bounds a hung run: no assertion depends on how long anything took


def test_periodic_rereads_waiting_on_the_database_hold_up_no_check_in(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    clock = Clock()
    app = create_app(ServerConfig(tmp_path / "data", keys.path, admin_token="admin-secret", enroll_token="enrol"),
                     clock=clock)
    service, engine = app.state.service, app.state.engine
    token, _ = service.register_with_server_token("enrol", DeviceProfile("held-dev"))

    # A slow database: once `slow` is set, every statement waits on `gate` before it runs.
    slow, gate, answered = threading.Event(), threading.Event(), threading.Event()
    reading = {"server_secrets": threading.Event(), "roots": threading.Event()}  # a re-read waits on the gate

    def hold(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if slow.is_set():
            for table, started in reading.items():
                if f"FROM {table}" in statement:
                    started.set()
            gate.wait(GIVE_UP_S)
            answered.set()

    sa.event.listen(engine, "before_cursor_execute", hold)
    checkin = {"device_id": "held-dev", "app_version": "1.0", "os": "linux"}

    async def run() -> tuple[int, int, bool, int, int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fleet") as client:
            async def check_in() -> httpx.Response:
                return await client.post("/v1/devices/held-dev/checkin", json=checkin,
                                         headers={"Authorization": f"Bearer {token}"})

            def admin() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.get("/v1/admin/releases",
                                                      headers={"Authorization": "Bearer admin-secret"}))

            first = (await check_in()).status_code  # the device's token, the root and the releases are now held
            before = (await admin()).status_code     # and the admin token's hash
            clock.now += ROOT_TTL_S  # every one of them is due for a re-read (the token is held for longer)
            slow.set()
            waiting_admin = admin()  # its token's re-read waits on the database
            await asyncio.to_thread(reading["server_secrets"].wait, GIVE_UP_S)
            held = await check_in()  # answered from what is held; the root's re-read starts, and waits
            await asyncio.to_thread(reading["roots"].wait, GIVE_UP_S)
            answered_while_waiting = not answered.is_set()
            gate.set()
            after = await check_in()
            return (first, before, answered_while_waiting, held.status_code, (await waiting_admin).status_code,
                    after.status_code)

    first, before, answered_while_waiting, held, waited_admin, after = asyncio.run(run())
    assert (first, before) == (200, 200)
    assert answered_while_waiting, "a check-in waited for a periodic re-read on the event loop"
    assert held == 200
    assert all(started.is_set() for started in reading.values())  # both re-reads did wait on the database
    assert waited_admin == 200 and after == 200  # each answered once the database is back


def test_a_reread_begun_before_an_invalidation_does_not_answer_it() -> None:
    """A release published while a periodic re-read is under way: that re-read may have read the table before
    the publish, so whoever waits for the invalidation gets a later one."""
    clock, table, gate, reading = Clock(), {"version": 1}, threading.Event(), threading.Event()

    def load(_held: int | None) -> int:
        version = table["version"]
        reading.set()
        gate.wait(GIVE_UP_S)
        return version

    gate.set()
    cell = Refreshed(load, 1.0, clock)
    assert cell.get() == 1

    async def run() -> tuple[int, int]:
        gate.clear()
        reading.clear()
        clock.now += 1.0
        stale = await cell.get_async()  # held past its period: answered at once, a re-read starts
        await asyncio.to_thread(reading.wait, GIVE_UP_S)  # that re-read has read version 1
        table["version"] = 2
        cell.invalidate()
        waiter = asyncio.create_task(cell.get_async())
        await asyncio.sleep(0)
        gate.set()
        return stale, await waiter

    assert asyncio.run(run()) == (1, 2)


def test_a_database_error_keeps_what_is_held_and_is_raised_when_nothing_is() -> None:
    clock, fail, calls = Clock(), [False], [0]

    def load(_held: int | None) -> int:
        calls[0] += 1
        if fail[0]:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("the database is restarting"))
        return 7

    fail[0] = True
    with pytest.raises(sa.exc.OperationalError):
        Refreshed(load, 1.0, clock).get()
    cell = Refreshed(load, 1.0, clock, retry_s=0.5)
    fail[0] = False
    assert cell.get() == 7
    fail[0], clock.now = True, clock.now + 1.0
    assert cell.get() == 7     # the database away: the held value ...
    calls[0] = 0
    clock.now += 0.4
    assert cell.get() == 7 and calls[0] == 0  # ... not looked up again before retry_s
    clock.now += 0.1
    assert cell.get() == 7 and calls[0] == 1


def test_worker_threads_answer_a_value_past_its_period_while_one_of_them_rereads_it() -> None:
    """A burst of worker threads (a step's assignments) must not all re-read the same table at once; one that
    was invalidated is still waited for by every reader."""
    clock, gate, reading, calls = Clock(), threading.Event(), threading.Event(), [0]

    def load(_held: int | None) -> int:
        calls[0] += 1
        if calls[0] > 1:
            reading.set()
            gate.wait(GIVE_UP_S)
        return calls[0]

    cell = Refreshed(load, 1.0, clock)
    assert cell.get() == 1
    clock.now += 1.0
    first = threading.Thread(target=cell.get)
    first.start()
    assert reading.wait(GIVE_UP_S)
    assert cell.get() == 1  # another thread re-reads: the held value, no second read
    assert calls[0] == 2
    gate.set()
    first.join(GIVE_UP_S)
    cell.invalidate()
    assert cell.get() == 3  # invalidated: read again in the calling thread
