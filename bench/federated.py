"""The issue's end-to-end federation, too long for CI: real agents on a loopback fleet server learning
scikit-learn's digits split non-IID (2-3 classes per device), held-out accuracy per round, and every
round's global weights against FedAvg computed directly in numpy from the same seeds and data.

    PYTHONPATH=$PWD .venv/bin/python bench/federated.py [--devices 8] [--rounds 10] [--epochs 2] [--lr 0.5]
        [--server-lr 2]
        [--out bench/results/federated.json]
    PYTHONPATH=$PWD .venv/bin/python bench/federated.py --compression    # int8 / top-k accuracy cost, in numpy

--compression runs the same federation without the fleet (local training and FedAvg in this process), once
per update compression, and prints the final held-out accuracy of each against the uncompressed run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def full_run(args: argparse.Namespace) -> dict[str, object]:
    from edgerun.fleet.federated.demo import run_federated
    from edgerun.fleet.federated.digits_data import digits_model, digits_split, direct_fedavg

    start, cpu = time.time(), time.process_time()
    run = run_federated(args.devices, args.rounds, epochs=args.epochs, lr=args.lr, server_lr=args.server_lr,
                        seed=args.seed)
    wall = time.time() - start
    shards, _ = digits_split(args.devices, args.seed)
    model, _, initial = digits_model(args.seed, args.lr)
    published = [r.outcome == "published" for r in run.results]
    reference = (direct_fedavg(model, initial, shards, run.sampled, args.seed, args.epochs, server_lr=args.server_lr)
                 if all(published) else [])
    worst = max((float(np.max(np.abs(run.weights[i][n] - w[n]))) for i, w in enumerate(reference) for n in w),
                default=float("nan"))
    accuracies = [r.metric for r in run.results]
    print(f"held-out accuracy per round: {[round(a, 3) if a is not None else None for a in accuracies]}")
    print(f"largest |fleet - direct numpy FedAvg| over all rounds and weights: {worst:.3g}")
    print(f"wall {wall:.0f} s (this process's CPU {time.process_time() - cpu:.0f} s), load {os.getloadavg()[0]:.1f}")
    return {"devices": args.devices, "rounds": args.rounds, "epochs": args.epochs, "lr": args.lr,
            "accuracy": accuracies, "outcomes": [r.outcome for r in run.results], "max_abs_diff": worst,
            "wall_s": wall, "load": os.getloadavg()[0]}


def compression_cost(args: argparse.Namespace) -> dict[str, object]:
    from edgerun.fleet.federated.compression import pack_update, unpack_update
    from edgerun.fleet.federated.digits_data import accuracy, digits_model, digits_split
    from edgerun.fleet.federated.fedavg import fedavg
    from edgerun.fleet.federated.local import local_update

    shards, (hx, hy) = digits_split(args.devices, args.seed)
    results: dict[str, object] = {}
    for scheme, fraction in (("none", 1.0), ("int8", 1.0), ("topk", 0.1)):
        model, _, weights = digits_model(args.seed, args.lr)
        curve, sent = [], 0
        for r in range(1, args.rounds + 1):
            updates = []
            for i, (images, labels) in enumerate(shards):
                delta, n = local_update(model, weights, images, labels, epochs=args.epochs, seed=(args.seed, r))
                packed = pack_update(delta, scheme, fraction)
                sent += sum(a.nbytes for a in packed.values())
                updates.append((str(i), unpack_update(packed, weights), n))
            weights = fedavg(weights, updates, r, server_lr=args.server_lr)
            curve.append(accuracy(model, weights, hx, hy))
        results[scheme] = {"accuracy": curve, "bytes_sent": sent}
        print(f"{scheme:>5}: final held-out accuracy {curve[-1]:.3f}, bytes uploaded {sent:,}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--server-lr", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compression", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = compression_cost(args) if args.compression else full_run(args)
    out = Path(args.out or f"bench/results/federated{'_compression' if args.compression else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
