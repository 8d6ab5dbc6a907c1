"""`edgerun fleet federated start|status|stop` and `edgerun fleet demo federated` (docs/federated.md)."""

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


def register_demo(p: argparse.ArgumentParser) -> None:
    """The federated demo's options on `fleet demo`."""
    p.add_argument("--rounds", type=int, default=10, help="federated: rounds")
    p.add_argument("--epochs", type=int, default=2, help="federated: local epochs per round")
    p.add_argument("--lr", type=float, default=0.5, help="federated: local SGD learning rate")
    p.add_argument("--server-lr", type=float, default=2.0, help="federated: the server's step along the mean update")
    p.add_argument("--per-round", type=int, help="federated: devices sampled per round (default: all)")
    p.add_argument("--faults", help="federated: DEVICE=FAULT,... with FAULT silent (a straggler), nan, huge "
                                    "(100x) or twice (its update sent twice), e.g. 1=nan,2=twice")
