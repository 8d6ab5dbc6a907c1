"""`edgerun fleet demo federated`: a loopback fleet server and N device agents learning scikit-learn's
digits together, split non-IID (each device holds 2 or 3 classes).

Every round goes the whole way: the job samples devices (rounds.py); each sampled agent checks in, which
installs the round's global weights as a signed release of the training task; it trains E local epochs
on its own shard inside the compute container (training_task.py) and uploads its delta through the stream
tunnel (device.py); the server side reads the records (collector.py), aggregates, evaluates on the
held-out fifth of the digits and publishes the next version through the staged release (publisher.py).
A table row per round: participants, refused updates, stragglers, held-out accuracy.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgerun.fleet import database
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.collector import collect, fetch_records
from edgerun.fleet.federated.device import FAULTS, FederatedDevice
from edgerun.fleet.federated.digits_data import accuracy, digits_model, digits_split
from edgerun.fleet.federated.publisher import FleetPublisher, release_version
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig, RoundResult
from edgerun.fleet.federated.training_task import write_training_task
from edgerun.fleet.local_server import FleetServer, start_server
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile

JOB = "digits-fl"
NORM_BOUND = 50.0  # honest digits updates have norms of 3 to 4 (bench/federated.py); a 100x one is refused


@dataclass
class DemoRun:
    results: list[RoundResult] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)       # device indexes per round
    honest: list[list[int]] = field(default_factory=list)        # those that sent their own update
    weights: list[dict[str, np.ndarray]] = field(default_factory=list)  # global weights after each round


def run_federated(devices: int = 8, rounds: int = 10, *, per_round: int | None = None, epochs: int = 2,
                  lr: float = 0.5, server_lr: float = 2.0, seed: int = 0, work: Path | None = None,
                  faults: Mapping[int, str] | None = None, out: Callable[[str], None] = print) -> DemoRun:
    """The federation on loopback; everything lives under `work` (a temporary folder, removed, when None).
    `faults`: device index -> a fault it commits in every round it is sampled (device.FAULTS)."""
    faults = dict(faults or {})
    unknown = sorted({f for f in faults.values() if f not in FAULTS} | {i for i in faults if not 0 <= i < devices})
    if unknown:
        raise FleetError(f"unknown faults or devices {unknown}; faults: {', '.join(FAULTS)}")
    if devices < 1 or rounds < 1 or epochs < 1:
        raise FleetError("--devices, --rounds and --epochs must be at least 1")
    per_round = devices if per_round is None else per_round
    if not 1 <= per_round <= devices:
        raise FleetError(f"--per-round must be between 1 and --devices ({devices}), got {per_round}")
    keep = work is not None
    if work is not None and Path(work).exists() and any(Path(work).iterdir()):
        raise FleetError(f"--keep {work}: give a new or empty folder (the demo makes its own keys and server)")
    base = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="edgerun-federated-"))
    base.mkdir(parents=True, exist_ok=True)
    keys = KeyDir(base / "keys")
    keys.init()
    server: FleetServer | None = None
    fleet: list[FederatedDevice] = []
    run = DemoRun()
    try:
        server = start_server(base, keys, admin_token=secrets.token_urlsafe(24),
                              enroll_token=secrets.token_urlsafe(24))
        out(f"fleet server on {server.url}; {devices} devices, {rounds} rounds, {epochs} local epochs")
        shards, (held_images, held_labels) = digits_split(devices, seed)
        model, _, initial = digits_model(seed, lr)
        task = write_training_task(base / "task", JOB, model, initial, epochs=epochs)
        admin = server.admin()
        publish = FleetPublisher(admin, keys, task, base / "packages", {"steps": [100], "min_reports": 1})
        publish(1, initial)
        engine = database.create_engine(database.sqlite_url(server.data))  # the server's own database
        job = FederatedJob.start(engine, JobConfig(JOB, rounds=rounds, per_round=per_round, quorum=per_round,
                                                   deadline_s=3600.0, norm_bound=NORM_BOUND, max_drop=0.10, seed=seed, epochs=epochs,
                                                   server_lr=server_lr),
                                 initial, base / "updates")
        for i, (images, labels) in enumerate(shards):
            fleet.append(FederatedDevice(server.agent(f"phone-{i}", base / f"phone-{i}"), JOB, images, labels))
        profiles = [DeviceProfile(d.agent.device_id) for d in fleet]
        index = {d.agent.device_id: i for i, d in enumerate(fleet)}
        out(f"{'round':>5} {'sampled':>7} {'applied':>7} {'refused':>7} {'duplicates':>10} {'stragglers':>10} "
            f"{'samples':>7} "
            f"{'held-out acc':>12} {'outcome':>11} {'version':>7}")
        version = 1
        for r in range(1, rounds + 1):
            now = time.time()
            sampled = job.open_round(profiles, now)
            for device in sampled:
                fleet[index[device]].train(r, seed, release_version(version), faults.get(index[device]))
            collect(job, fetch_records(server.url, server.admin_token, JOB), time.time())
            result = job.close_round(lambda w: accuracy(model, w, held_images, held_labels), publish)
            version = result.version
            run.results.append(result)
            run.sampled.append(sorted(index[d] for d in sampled))
            run.honest.append([i for i in run.sampled[-1] if faults.get(i) in (None, "twice")])
            run.weights.append(job.global_weights())
            refused = sum(result.refused.values())
            out(f"{r:>5} {len(sampled):>7} {result.participants:>7} {refused:>7} {result.duplicates:>10} "
                f"{result.stragglers:>10} "
                f"{result.samples:>7} {result.metric if result.metric is not None else float('nan'):>12.3f} "
                f"{result.outcome:>11} {result.version:>7}")
        admin.close()
        return run
    finally:
        for d in fleet:
            d.close()
            d.agent.close()
        if server is not None:
            server.stop()
        if keep:
            out(f"kept in {base}: server log and database, keys, task packages, each device's state")
        else:
            shutil.rmtree(base, ignore_errors=True)


def run_demo(devices: int = 8, rounds: int = 10, epochs: int = 2, lr: float = 0.5, server_lr: float = 2.0,
             per_round: int | None = None, work: Path | None = None, faults: Mapping[int, str] | None = None) -> int:
    """The CLI's entry: the table, then exit status 0 once every round has run."""
    run = run_federated(devices, rounds, per_round=per_round, epochs=epochs, lr=lr, server_lr=server_lr, work=work,
                        faults=faults)
    best = max((r.metric for r in run.results if r.metric is not None), default=float("nan"))
    print(f"best held-out accuracy {best:.3f}")
    return 0
