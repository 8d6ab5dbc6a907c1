"""`edgerun fleet federated start|run|status|stop` and `edgerun fleet demo federated` (docs/federated.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgerun.errors import EdgerunError


def _job(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from edgerun.fleet import database
    from edgerun.fleet.federated.rounds import FederatedJob

    return FederatedJob(database.create_engine(_db_url(args)), args.name, Path(args.data) / "federated-updates")


def _db_url(args: argparse.Namespace) -> str:
    from edgerun.fleet import database

    return args.db or database.sqlite_url(args.data)


def cmd_start(args: argparse.Namespace) -> int:
    from edgerun.fleet import database
    from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
    from edgerun.training import read_weights

    config = JobConfig(args.name, rounds=args.rounds, per_round=args.per_round,
                       quorum=args.quorum if args.quorum is not None else args.per_round, deadline_s=args.deadline_s,
                       targeting=json.loads(args.targeting), norm_bound=args.norm_bound, clip=args.clip,
                       noise_multiplier=args.noise_multiplier, max_drop=args.max_drop, seed=args.seed,
                       epochs=args.epochs, mu=args.mu, server_lr=args.server_lr,
                       idle_and_charging=args.idle_and_charging)
    FederatedJob.start(database.create_engine(_db_url(args)), config, read_weights(args.weights),
                       Path(args.data) / "federated-updates")
    print(f"started federated job {args.name!r}: {args.rounds} rounds of {args.per_round} devices")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Drive the job's rounds among the fleet until it is done or stopped (coordinator.py)."""
    import tempfile
    import time

    import numpy as np

    from edgerun.fleet.admin_client import AdminClient
    from edgerun.fleet.federated.collector import fetch_records
    from edgerun.fleet.federated.coordinator import NoDeviceYet, RoundDriver
    from edgerun.fleet.federated.digits_data import accuracy
    from edgerun.fleet.federated.publisher import FleetPublisher
    from edgerun.fleet.federated.rounds import fleet_devices
    from edgerun.fleet.federated.training_task import PROGRAM_PATH
    from edgerun.fleet.signing import KeyDir
    from edgerun.secret_files import secret_from
    from edgerun.training import TrainingProgram

    try:
        with np.load(args.held_out, allow_pickle=False) as held:
            images, labels = held["images"].astype(np.float32), held["labels"].astype(np.int64)
    except (OSError, KeyError, ValueError) as exc:
        raise EdgerunError(f"--held-out {args.held_out}: not an .npz of 'images' and 'labels' ({exc})") from None
    model = TrainingProgram.read(Path(args.task) / PROGRAM_PATH)
    token = secret_from(args.admin_token_file, "EDGERUN_FLEET_TOKEN")
    admin = AdminClient(args.server, token)
    job = _job(args)
    policy = json.loads(args.policy)
    with tempfile.TemporaryDirectory(prefix="edgerun-federated-") as packages:
        driver = RoundDriver(job, FleetPublisher(admin, KeyDir(args.keys), args.task, packages, policy), admin,
                             lambda now: fleet_devices(job.engine, now - args.seen_s),
                             lambda: fetch_records(args.server, token, args.name),
                             lambda weights: accuracy(model, weights, images, labels))
        waiting = ""
        while driver.running():
            try:
                result = driver.step(time.time())
            except NoDeviceYet as exc:  # no device to sample yet: say so once, try again
                if str(exc) != waiting:
                    print(f"waiting: {exc}", flush=True)
                    waiting = str(exc)
                result = None
            if result is not None:
                print(json.dumps({"round": result.round, "outcome": result.outcome, "version": result.version,
                                  "participants": result.participants, "stragglers": result.stragglers,
                                  "duplicates": result.duplicates, "refused": result.refused,
                                  "metric": result.metric}), flush=True)
            else:
                time.sleep(args.poll_s)
    admin.close()
    print(f"federated job {args.name!r} is {job.status()['status']}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(_job(args).status(), indent=1))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    _job(args).stop()
    print(f"stopped federated job {args.name!r}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from edgerun.fleet.federated.demo import run_demo

    faults = {}
    for item in (args.faults or "").split(","):
        if item.strip():
            device, _, fault = item.partition("=")
            if not device.strip().isdigit():
                raise EdgerunError(f"--faults takes DEVICE=FAULT pairs such as 1=nan,2=twice; got {item!r}")
            faults[int(device)] = fault.strip()
    return run_demo(8 if args.devices is None else args.devices, args.rounds, args.epochs, args.lr, args.server_lr, args.per_round,
                    Path(args.keep) if args.keep else None, faults)


def register(fsub: argparse._SubParsersAction) -> None:
    federated = fsub.add_parser("federated", help="federated learning jobs: rounds of on-device training")
    sub = federated.add_subparsers(dest="federated_command", metavar="ACTION", required=True)
    for name, func, text in (("start", cmd_start, "create a job with its initial global weights"),
                             ("run", cmd_run, "drive the job's rounds among the fleet until it is done"),
                             ("status", cmd_status, "the job's state and every round's summary"),
                             ("stop", cmd_stop, "stop the job (no further rounds open)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--data", required=True, help="the fleet server's data folder (its SQLite database)")
        p.add_argument("--db", default="", help="the fleet database URL when it is not the folder's SQLite")
        p.add_argument("--name", required=True, help="the job's name (also its training task's name)")
        p.set_defaults(func=func)
        if name == "start":
            p.add_argument("--weights", required=True, help="the initial global weights (a weights file)")
            p.add_argument("--rounds", type=int, default=10)
            p.add_argument("--per-round", type=int, default=8, help="devices sampled each round")
            p.add_argument("--quorum", type=int, help="accepted updates that close a round (default: --per-round)")
            p.add_argument("--deadline-s", type=float, default=600.0, help="a round closes this long after it opened")
            p.add_argument("--targeting", default='{"kind": "uniform"}', help="release targeting, as JSON")
            p.add_argument("--norm-bound", type=float, help="refuse updates with a larger global L2 norm")
            p.add_argument("--clip", type=float, help="clip every update to this L2 norm")
            p.add_argument("--noise-multiplier", type=float, default=0.0, help="Gaussian noise, times --clip")
            p.add_argument("--max-drop", type=float, default=0.05, help="roll back a round this far below the best")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--epochs", type=int, default=1, help="local epochs per round")
            p.add_argument("--mu", type=float, default=0.0, help="FedProx's proximal weight")
            p.add_argument("--server-lr", type=float, default=1.0, help="global += this times the mean update")
            p.add_argument("--idle-and-charging", action="store_true",
                           help="sample only devices whose last check-in said they were idle and charging")
        if name == "run":
            p.add_argument("--server", required=True, help="the fleet server's URL")
            p.add_argument("--admin-token-file", help="file holding the admin token (default: $EDGERUN_FLEET_TOKEN)")
            p.add_argument("--keys", required=True, help="the key folder whose release key signs the invitations")
            p.add_argument("--task", required=True, help="the job's training task folder (write_training_task)")
            p.add_argument("--held-out", required=True, help="an .npz of 'images' and 'labels' each round is "
                                                             "evaluated on")
            p.add_argument("--policy", default='{"steps": [100], "min_reports": 1}',
                           help="the staged-release policy of every invitation, as JSON")
            p.add_argument("--seen-s", type=float, default=600.0, help="sample among devices seen this recently")
            p.add_argument("--poll-s", type=float, default=1.0, help="seconds between looks at the uploads")


def register_demo(p: argparse.ArgumentParser) -> None:
    """The federated demo's options on `fleet demo`."""
    p.add_argument("--rounds", type=int, default=10, help="federated: rounds")
    p.add_argument("--epochs", type=int, default=2, help="federated: local epochs per round")
    p.add_argument("--lr", type=float, default=0.5, help="federated: local SGD learning rate")
    p.add_argument("--server-lr", type=float, default=2.0, help="federated: the server's step along the mean update")
    p.add_argument("--per-round", type=int, help="federated: devices sampled per round (default: all)")
    p.add_argument("--faults", help="federated: DEVICE=FAULT,... with FAULT silent (a straggler), nan, huge "
                                    "(100x) or twice (its update sent twice), e.g. 1=nan,2=twice")
