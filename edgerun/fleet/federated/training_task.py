"""The training task kind: a task package that trains the job's global model on the device's data.

The package holds the training program (`models/train.edgerun`, a `TrainingProgram.save` file: numpy alone
runs it), the global weights of its version (`global.weights`, replaced in every published round:
publisher.py) and `main.py`. A round's run reads the round, the seed and the device's local samples from
one of two places: a round's invitation (publisher.invite) has the round and the seed in `federated.json`
and is run once by the agent with {"data_dir"} as its input, the samples being `samples.npz` ("images",
"labels") in that folder (`<agent state>/stream/data/<job>` on the device); the in-process path
(device.py) gives {"round", "seed", "data"}, "data" an encoded .npz. It trains `epochs` local epochs from the global weights inside the isolating container (local.py,
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

SETTINGS_PATH = "federated.json"
SAMPLES_FILE = "samples.npz"  # the device's local samples in the task's data folder

TRAIN_SCRIPT = '''\
"""A federated training round on this device (edgerun.fleet.federated.training_task)."""
import json
import os

import numpy as np

from edgerun.fleet.federated.compression import pack_update
from edgerun.fleet.federated.local import local_update
from edgerun.fleet.federated.training_task import decode_arrays, encode_arrays
from edgerun.training import TrainingProgram, read_weights

SETTINGS = json.load(open("federated.json"))
MODEL = TrainingProgram.read("models/train.edgerun")


def run(inputs):
    if "data_dir" in inputs:  # a round's invitation, run once by the agent on the device's data folder
        round_number, seed = int(SETTINGS["round"]), int(SETTINGS["seed"])
        with np.load(os.path.join(inputs["data_dir"], "samples.npz"), allow_pickle=False) as data:
            images, labels = data["images"].astype(np.float32), data["labels"].astype(np.int64)
    else:
        round_number, seed = int(inputs["round"]), int(inputs["seed"])
        data = decode_arrays(inputs["data"])
        images, labels = data["images"], data["labels"]
    delta, samples = local_update(MODEL, read_weights("global.weights"), images, labels,
                                  epochs=SETTINGS["epochs"], seed=(seed, round_number), mu=SETTINGS["mu"])
    packed = pack_update(delta, SETTINGS["compression"], SETTINGS.get("fraction", 0.1))
    return {"job": SETTINGS["job"], "round": round_number, "samples": samples,
            "update": encode_arrays(packed)}
'''


def record_id(job: str, round_number: int) -> str:
    """The stream record id of a device's update for a round: fixed by the round, so a repeat is one record."""
    return f"federated:{job}:{round_number}"


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
    (folder / SETTINGS_PATH).write_text(json.dumps({"job": job, "epochs": epochs, "mu": mu,
                                                       "compression": compression}))
    (folder / "task.json").write_text(json.dumps({
        "name": job, "version": version, "entry": "main.py",
        "limits": {"timeout_s": timeout_s, "memory_mb": memory_mb}}))
    return folder
