"""Training only on idle, charging devices: the agent reports both in its profile at every check-in (read
from the machine's power-supply class and load, or given by the app), the fleet server stores them, and a
federated job with `idle_and_charging` samples only the devices whose last check-in said both."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from edgerun.fleet import database
from edgerun.fleet.device_state import DeviceState, on_external_power, read_device_state
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, fleet_devices
from edgerun.fleet.local_server import start_server
from edgerun.fleet.signing import KeyDir

INITIAL = {"w": np.zeros(3, np.float32)}


def test_the_job_samples_only_devices_whose_last_check_in_said_idle_and_charging(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path, keys)
    try:
        states = {"phone-0": DeviceState(True, True), "phone-1": DeviceState(True, False),
                  "phone-2": DeviceState(False, True), "phone-3": DeviceState(True, True)}
        agents = [server.agent(d, tmp_path / d, device_state=lambda d=d: states[d]) for d in states]
        before = time.time()
        for agent in agents:
            agent.check_in()
        server.wait_seen()
        engine = database.create_engine(database.sqlite_url(server.data))  # the server's own, migrated database
        seen = {p.device_id: (p.idle, p.charging) for p in fleet_devices(engine, before - 1)}
        assert seen == {d: (s.idle, s.charging) for d, s in states.items()}

        picky = FederatedJob.start(engine, JobConfig("picky", per_round=4, quorum=1, idle_and_charging=True),
                                   INITIAL, tmp_path / "updates")
        assert picky.open_round(fleet_devices(engine, before - 1), now=0.0) == ["phone-0", "phone-3"]
        anyone = FederatedJob.start(engine, JobConfig("anyone", per_round=4, quorum=1), INITIAL, tmp_path / "updates")
        assert anyone.open_round(fleet_devices(engine, before - 1), now=0.0) == sorted(states)

        # phone-0 is unplugged, phone-3 picked up: the next job's round sees their latest check-in
        states["phone-0"], states["phone-3"] = DeviceState(True, False), DeviceState(False, False)
        for agent in agents:
            agent.check_in()
        server.wait_seen()
        late = FederatedJob.start(engine, JobConfig("late", per_round=4, quorum=1, idle_and_charging=True),
                                  INITIAL, tmp_path / "updates")
        with pytest.raises(FleetError, match="targeting and is idle and charging"):
            late.open_round(fleet_devices(engine, before - 1), now=0.0)
        assert fleet_devices(engine, time.time() + 60) == []  # nobody seen in the future
        engine.dispose()
    finally:
        server.stop()


def test_power_and_load_are_read_from_the_machine(tmp_path: Path) -> None:
    def supply(name: str, **files: str) -> None:
        (tmp_path / name).mkdir()
        for key, value in files.items():
            (tmp_path / name / key).write_text(value + "\n")

    assert on_external_power(tmp_path / "absent")  # no power-supply class at all: a mains machine
    supply("BAT0", type="Battery", status="Discharging")
    supply("AC", type="Mains", online="0")
    assert not on_external_power(tmp_path)
    (tmp_path / "AC" / "online").write_text("1\n")
    assert on_external_power(tmp_path)
    (tmp_path / "AC" / "online").write_text("0\n")
    (tmp_path / "BAT0" / "status").write_text("Full\n")
    assert on_external_power(tmp_path)
    busy = read_device_state(tmp_path, loadavg=lambda: (3.0, 0.0, 0.0), cpus=4)
    quiet = read_device_state(tmp_path, loadavg=lambda: (1.0, 0.0, 0.0), cpus=4)
    assert (busy, quiet) == (DeviceState(False, True), DeviceState(True, True))
