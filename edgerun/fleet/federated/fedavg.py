"""Federated averaging (McMahan et al. 2017) as a running weighted sum: updates are added one at a time and
never held together, so aggregating 1,000 updates of a model needs two copies of the model, not 1,000.

The average is weighted by each device's sample count (FedAvg). FedProx (Li et al. 2020) aggregates the
same way; its proximal term lives in the devices' local training (`local.py`). With clipping and noise on
(`privacy.py`), every accepted update weighs the same (DP-FedAvg's fixed weights: a device's influence on
the sum is then bounded by the clip), and Gaussian noise is added to the sum once, before the division.

Each (round, device) is applied at most once: an update sent twice (a retry after a lost answer) is
counted as a duplicate and changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.privacy import clip_update
from edgerun.fleet.federated.update import validate_update


class StreamingFedAvg:
    """The aggregate of one round. `offer(device, delta, samples)` returns "applied", "duplicate" or the
    reason the update is refused; `average()` is the weighted mean delta of the applied updates and
    `apply_to(global_weights)` the next global weights."""

    def __init__(self, round_number: int, reference: Mapping[str, np.ndarray], *, norm_bound: float | None = None,
                 clip: float | None = None, noise_multiplier: float = 0.0, seed: int = 0) -> None:
        if clip is None and noise_multiplier:
            raise FleetError("Gaussian noise needs a clip norm (the noise is scaled to it)")
        if clip is not None and not clip > 0:
            raise FleetError(f"the clip norm must be > 0, got {clip}")
        self.round = round_number
        self.reference = {name: np.asarray(a) for name, a in reference.items()}
        self.norm_bound = norm_bound
        self.clip = clip
        self.noise_multiplier = float(noise_multiplier)
        self.seed = seed
        self.sums = {name: np.zeros(a.shape, np.float64) for name, a in self.reference.items()}
        self.total_weight = 0.0
        self.total_samples = 0
        self.devices: set[str] = set()  # devices applied in this round
        self.refused: Counter[str] = Counter()
        self.duplicates = 0

    def offer(self, device: str, delta: Mapping[str, np.ndarray], samples: object) -> str:
        if device in self.devices:
            self.duplicates += 1
            return "duplicate"
        reason = validate_update(delta, samples, self.reference, self.norm_bound)
        if reason is not None:
            self.refused[reason] += 1
            return reason
        assert isinstance(samples, int | np.integer)
        weight = float(samples)
        if self.clip is not None:
            delta = clip_update(delta, self.clip)
            weight = 1.0
        for name, array in delta.items():
            self.sums[name] += weight * np.asarray(array, np.float64)
        self.total_weight += weight
        self.total_samples += int(samples)
        self.devices.add(device)
        return "applied"

    @property
    def applied(self) -> int:
        return len(self.devices)

    def checkpoint(self) -> dict[str, np.ndarray]:
        """The running sum as arrays (np.savez writes them): what `restore` needs to go on from here."""
        return {**{f"sum/{name}": total for name, total in self.sums.items()},
                "total_weight": np.asarray(self.total_weight, np.float64),
                "total_samples": np.asarray(self.total_samples, np.int64),
                "applied": np.asarray(len(self.devices), np.int64)}

    def restore(self, arrays: Mapping[str, np.ndarray], devices: Iterable[str]) -> None:
        """Go on from a `checkpoint()` that holds the updates of `devices` (the ones recorded as applied)."""
        devices = set(devices)
        if int(arrays["applied"]) != len(devices):
            raise FleetError(f"round {self.round}'s running sum holds {int(arrays['applied'])} updates, "
                             f"{len(devices)} are recorded as applied")
        sums = {name: np.asarray(arrays[f"sum/{name}"], np.float64) for name in self.reference}
        if any(sums[name].shape != a.shape for name, a in self.reference.items()):
            raise FleetError(f"round {self.round}'s running sum does not have the model's shapes")
        self.sums, self.devices = sums, devices
        self.total_weight, self.total_samples = float(arrays["total_weight"]), int(arrays["total_samples"])

    def average(self) -> dict[str, np.ndarray]:
        """The weighted mean delta (float32 per the reference's dtype); noise added when configured."""
        if not self.devices:
            raise FleetError(f"round {self.round} has no accepted update to aggregate")
        rng = np.random.default_rng([self.seed, self.round])
        out = {}
        for name, total in self.sums.items():
            if self.noise_multiplier:
                assert self.clip is not None
                total = total + rng.normal(0.0, self.noise_multiplier * self.clip, total.shape)
            out[name] = (total / self.total_weight).astype(self.reference[name].dtype)
        return out

    def apply_to(self, global_weights: Mapping[str, np.ndarray], server_lr: float = 1.0) -> dict[str, np.ndarray]:
        """global + server_lr * average: the next global weights. A server learning rate above 1 (FedAvg
        with a server step, Reddi et al. 2021) moves further along the devices' mean direction, which
        offsets part of the shrinkage that averaging drifting non-IID updates causes."""
        mean = self.average()
        return {name: (np.asarray(w, np.float64) + server_lr * mean[name].astype(np.float64)).astype(w.dtype)
                for name, w in global_weights.items()}


def fedavg(global_weights: Mapping[str, np.ndarray], updates: Iterable[tuple[str, Mapping[str, np.ndarray], int]],
           round_number: int = 0, norm_bound: float | None = None, server_lr: float = 1.0) -> dict[str, np.ndarray]:
    """The next global weights from (device, delta, samples) updates: FedAvg in one call."""
    aggregate = StreamingFedAvg(round_number, global_weights, norm_bound=norm_bound)
    for device, delta, samples in updates:
        aggregate.offer(device, delta, samples)
    return aggregate.apply_to(global_weights, server_lr)
