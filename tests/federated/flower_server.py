"""A Flower server for tests/federated/test_flower.py, run by the Flower venv's Python: Flower's own FedAvg
(every client each round) starting from the given parameters, with the round and seed in each fit config.
Each round's aggregated parameters are written to OUT/round-R.npz and the evaluation history to
OUT/history.json, so the test compares them with edgerun's own rounds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import flwr
import numpy as np
from flwr.common import parameters_to_ndarrays
from flwr.server.strategy import FedAvg


class RecordingFedAvg(FedAvg):  # type: ignore[misc]
    def __init__(self, out: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.out = out

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is not None:
            np.savez(self.out / f"round-{server_round}.npz", *parameters_to_ndarrays(parameters))
        return parameters, metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--initial", required=True, help=".npz of the starting parameters, in order")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with np.load(args.initial) as archive:
        initial = [archive[f"arr_{i}"] for i in range(len(archive.files))]
    seed = args.seed
    strategy = RecordingFedAvg(
        Path(args.out), fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=args.clients,
        min_evaluate_clients=args.clients, min_available_clients=args.clients,
        initial_parameters=flwr.common.ndarrays_to_parameters(initial),
        on_fit_config_fn=lambda server_round: {"round": server_round, "seed": seed},
        evaluate_metrics_aggregation_fn=lambda results: {
            "accuracy": sum(n * m["accuracy"] for n, m in results) / sum(n for n, _ in results)})
    history = flwr.server.start_server(server_address=args.address, strategy=strategy,
                                       config=flwr.server.ServerConfig(num_rounds=args.rounds, round_timeout=120))
    (Path(args.out) / "history.json").write_text(json.dumps({
        "losses": history.losses_distributed,
        "accuracy": history.metrics_distributed.get("accuracy", [])}))


if __name__ == "__main__":
    main()
