"""The dashboard's device table data (`/v1/admin/overview`): what each device runs and when it was last heard
from come from its latest run reports as well as its last check-in, on a real SQLite database."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from edgerun.fleet.admin_api import overview_data
from edgerun.fleet.schema import devices, metadata, reports


def test_a_device_shows_the_version_its_latest_run_reported_and_its_latest_contact(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'fleet.db'}")
    metadata.create_all(engine)
    with engine.begin() as conn:
        # Checked in at t=100 with hello@3 installed; then the rollback's v4 was installed and ran at t=250.
        for dev, token in (("phone-1", "a" * 64), ("phone-2", "b" * 64)):
            conn.execute(devices.insert().values(id=dev, token_hash=token, registered_at=50.0, last_seen=100.0,
                                                 profile={"app_version": "1.0", "os": "linux",
                                                          "tasks": {"hello": 3}}))
        rows = [("r1", "phone-1", "hello", 3, 120.0), ("r2", "phone-1", "hello", 4, 250.0),
                ("r3", "phone-1", "recommend", 1, 200.0), ("r4", "phone-1", "hello", 3, 90.0)]
        for run_id, dev, task, version, at in rows:
            conn.execute(reports.insert().values(id=run_id, device_id=dev, task=task, version=version,
                                                 outcome="success", latency_ms=1.0, error="", received_at=at))
    table = {d["id"]: d for d in overview_data(engine)["devices"]}
    one, two = table["phone-1"], table["phone-2"]
    assert one["tasks"] == {"hello": 3}  # what the last check-in said was installed
    assert one["running"] == {"hello": 4, "recommend": 1} and one["last_seen"] == 250.0
    assert two["running"] == {} and two["last_seen"] == 100.0  # never reported: the check-in alone
