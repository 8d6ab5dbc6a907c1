"""Publishing a round's global weights as the next signed version of the job's training task, through the
fleet's ordinary release path: the task folder gets the new weights file and version, is packed, signed
with the offline release key and published with the operator's staged-release policy (docs/fleet.md).
Devices then receive the next round's starting weights as they receive any release, verified and
activated atomically, and a release the fleet's monitor finds bad is rolled back as any other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.fleet.admin_client import AdminClient
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
        write_weights(self.task_dir / WEIGHTS_NAME, weights, source="federated")
        config_path = self.task_dir / "task.json"
        config = json.loads(config_path.read_text())
        config["version"] = release_version(version)
        config_path.write_text(json.dumps(config))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        package = self.out_dir / f"{config['name']}-v{config['version']}.tar"
        pack_task(self.task_dir, package)
        record = self.admin.publish(package, self.keys, self.policy)
        self.releases[version] = record
        return record
