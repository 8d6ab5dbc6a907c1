"""Publishing a round's global weights as the next signed version of the job's training task, through the
fleet's ordinary release path: the task folder gets the new weights file and version, is packed, signed
with the offline release key and published with the operator's staged-release policy (docs/fleet.md).
Devices then receive the next round's starting weights as they receive any release, verified and
activated atomically, and a release the fleet's monitor finds bad is rolled back as any other.

`invite(round, seed, weights, devices)` publishes a round's invitation the same way (coordinator.py): the
package carries the round's starting weights, the round and the seed in `federated.json`, `run_once` with
the round's record id (so the device's agent runs it once, on activation, and uploads its output under that
id) and targeting of kind "device" naming the sampled devices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.fleet.admin_client import AdminClient
from edgerun.fleet.federated.training_task import SETTINGS_PATH, record_id
from edgerun.fleet.package import pack_task
from edgerun.fleet.signing import KeyDir
from edgerun.training.checkpoint import write_weights

WEIGHTS_NAME = "global.weights"


def release_version(job_version: int) -> int:
    """The task version that carries a job version: every release reserves the version after it for its
    signed rollback (docs/fleet.md), so job versions 1, 2, 3 ship as task versions 1, 3, 5."""
    return 2 * job_version - 1


class FleetPublisher:
    """`publish(version, weights)`: write `global.weights` into the task folder, set task.json's version,
    (release_version(version)), pack to `out_dir` and publish with `policy` (steps, min_reports, ...). Returns the release record."""

    def __init__(self, admin: AdminClient, keys: KeyDir, task_dir: str | Path, out_dir: str | Path,
                 policy: dict[str, Any] | None = None) -> None:
        self.admin, self.keys = admin, keys
        self.task_dir, self.out_dir = Path(task_dir), Path(out_dir)
        self.policy = policy or {"steps": [100], "min_reports": 1}
        self.releases: dict[int, dict[str, Any]] = {}

    def __call__(self, version: int, weights: dict[str, np.ndarray]) -> dict[str, Any]:
        return self._publish(release_version(version), weights, {})

    def invite(self, round_number: int, seed: int, weights: dict[str, np.ndarray],
               devices: list[str]) -> dict[str, Any]:
        """Round `round_number`'s invitation as task version release_version(round): a rolled-back round
        leaves no gap, since the next round's package carries the last good weights under its own number."""
        settings_path = self.task_dir / SETTINGS_PATH
        settings = json.loads(settings_path.read_text())
        settings.update(round=round_number, seed=seed)
        settings_path.write_text(json.dumps(settings))
        return self._publish(release_version(round_number), weights, {
            "run_once": {"record_id": record_id(settings["job"], round_number)},
            "targeting": {"kind": "device", "values": sorted(devices)}})

    def final(self, task_version: int, weights: dict[str, np.ndarray], devices: list[str]) -> dict[str, Any]:
        """The job's final weights to `devices`, as a release without `run_once` (nothing trains)."""
        config_path = self.task_dir / "task.json"
        config = json.loads(config_path.read_text())
        config.pop("run_once", None)
        config_path.write_text(json.dumps(config))
        return self._publish(task_version, weights, {"targeting": {"kind": "device", "values": sorted(devices)}})

    def _publish(self, task_version: int, weights: dict[str, np.ndarray], extra: dict[str, Any]) -> dict[str, Any]:
        write_weights(self.task_dir / WEIGHTS_NAME, weights, source="federated")
        config_path = self.task_dir / "task.json"
        config = json.loads(config_path.read_text())
        config.update(version=task_version, **extra)
        config_path.write_text(json.dumps(config))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        package = self.out_dir / f"{config['name']}-v{config['version']}.tar"
        pack_task(self.task_dir, package)
        record = self.admin.publish(package, self.keys, self.policy)
        self.releases[task_version] = record
        return record
