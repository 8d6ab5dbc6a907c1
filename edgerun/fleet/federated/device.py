"""The device side of a round: run the job's training task in the compute container on the local data and
hand its update to the stream tunnel.

The update goes into the device's collective storage (edgerun.stream.storage) under the record id
`federated:<job>:<round>`, fixed by the round: a run repeated after a crash writes the same id and the store
keeps one copy; the tunnel (edgerun.stream.uploader) resends until the cloud answers, and the cloud's
insert ignores a (device, record id) it already holds. So each round's update is stored in the cloud once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgerun.fleet.agent import Agent
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.training_task import decode_arrays, encode_arrays, record_id
from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Uploader

STATE_DIR = "federated"
# Faults a demo or test can make a device commit (demo.py --faults): "silent" trains but is killed before
# it uploads (a straggler), "nan" and "huge" upload a NaN or a 100x update instead of its own, "twice"
# uploads its update a second time under another record id (a device that re-ran the round).
FAULTS = ("silent", "nan", "huge", "twice")


class FederatedDevice:
    """An agent taking part in a job with its local samples (images and integer labels)."""

    def __init__(self, agent: Agent, job: str, images: np.ndarray, labels: np.ndarray) -> None:
        self.agent, self.job = agent, job
        self.data = encode_arrays({"images": np.asarray(images, np.float32), "labels": np.asarray(labels, np.int64)})
        state = Path(agent.state_dir) / STATE_DIR
        state.mkdir(parents=True, exist_ok=True)
        self.store = CollectiveStore(state / "outputs.db", flush_threshold=1)
        self.uploader = Uploader(self.store, agent.server_url.rstrip("/") + "/v1/stream", agent.device_id,
                                 token=lambda: agent.token)

    def train(self, round_number: int, seed: int, expect_version: int, fault: str | None = None) -> dict[str, Any]:
        """Check in (installing the round's global weights, a release like any other), train in the
        container, store the update and upload it. Returns the run's output."""
        self.agent.step()
        installed = self.agent.profile().tasks.get(self.job)
        if installed != expect_version:
            raise FleetError(f"{self.agent.device_id} holds {self.job} v{installed}, the round needs v{expect_version}")
        result = self.agent.run_task(self.job, {"round": round_number, "seed": seed, "data": self.data})
        if not result.ok:
            raise FleetError(f"{self.agent.device_id}: training run {result.outcome}: {result.error[-400:]}")
        output = dict(result.output)
        if fault == "silent":
            return output
        if fault in ("nan", "huge"):
            packed = decode_arrays(output["update"])
            for name, array in packed.items():
                if array.dtype.kind == "f" and array.ndim:
                    packed[name] = array * np.float32(100.0) if fault == "huge" else np.full_like(array, np.nan)
            output["update"] = encode_arrays(packed)
        self.store.put(self.job, output, record_id=record_id(self.job, round_number))
        if fault == "twice":
            self.store.put(self.job, output, record_id=record_id(self.job, round_number) + ":again")
        self.store.flush()
        self.uploader.upload_all()
        return output

    def close(self) -> None:
        self.uploader.close()
        self.store.close()
