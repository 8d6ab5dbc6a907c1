"""The training task kind: a task package that trains the job's global model on the device's data.

The package holds the training program (`models/train.edgerun`, a `TrainingProgram.save` file: numpy alone
runs it), the global weights of its version (`global.weights`, replaced in every published round:
publisher.py) and `main.py`. A round's run gets {"round", "seed", "data"} as inputs, where "data" is the
device's local samples (an encoded .npz of "images" and "labels", read by the agent side from the device's
data folder), trains `epochs` local epochs from the global weights inside the isolating container (local.py,
FedProx when `mu` > 0) and returns the packed delta (compression.py) with its sample count. The agent side
(device.py) stores that output in the stream pipeline's collective storage under a record id fixed by
(job, round), so the tunnel's at-least-once upload and the cloud's idempotent insert store it exactly once.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.training import TrainingProgram, write_weights

PROGRAM_PATH = "models/train.edgerun"
WEIGHTS_PATH = "global.weights"

TRAIN_SCRIPT = '''\
"""A federated training round on this device (edgerun.fleet.federated.training_task)."""
import json

from edgerun.fleet.federated.compression import pack_update
from edgerun.fleet.federated.local import local_update
from edgerun.fleet.federated.training_task import decode_arrays, encode_arrays
from edgerun.training import TrainingProgram, read_weights

SETTINGS = json.load(open("federated.json"))
MODEL = TrainingProgram.read("models/train.edgerun")


def run(inputs):
    data = decode_arrays(inputs["data"])
    delta, samples = local_update(MODEL, read_weights("global.weights"), data["images"], data["labels"],
                                  epochs=SETTINGS["epochs"], seed=(int(inputs["seed"]), int(inputs["round"])),
                                  mu=SETTINGS["mu"])
    packed = pack_update(delta, SETTINGS["compression"], SETTINGS.get("fraction", 0.1))
    return {"job": SETTINGS["job"], "round": int(inputs["round"]), "samples": samples,
            "update": encode_arrays(packed)}
'''


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> str:
    """Arrays as base64 text of an .npz (JSON carries it: task inputs, results and stream records)."""
    buffer = io.BytesIO()
    named: dict[str, Any] = {name: np.asarray(a) for name, a in arrays.items()}
    np.savez(buffer, **named)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_arrays(text: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def write_training_task(folder: str | Path, job: str, model: TrainingProgram, weights: Mapping[str, np.ndarray],
                        *, version: int = 1, epochs: int = 1, mu: float = 0.0, compression: str = "none",
                        timeout_s: float = 300.0, memory_mb: int = 1024) -> Path:
    """A task folder for `job` (also the task's name): the training program, the global weights, the script
    and its settings. Pack it with `edgerun task pack` or publish it round by round with FleetPublisher."""
    folder = Path(folder)
    (folder / "models").mkdir(parents=True, exist_ok=True)
    model.save(folder / PROGRAM_PATH)
    write_weights(folder / WEIGHTS_PATH, weights, source="federated")
    (folder / "main.py").write_text(TRAIN_SCRIPT)
    (folder / "federated.json").write_text(json.dumps({"job": job, "epochs": epochs, "mu": mu,
                                                       "compression": compression}))
    (folder / "task.json").write_text(json.dumps({
        "name": job, "version": version, "entry": "main.py",
        "limits": {"timeout_s": timeout_s, "memory_mb": memory_mb}}))
    return folder
