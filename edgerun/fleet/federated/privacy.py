"""Per-update clipping, Gaussian noise and the privacy accounting for it.

Clipping scales a device's whole update so its global L2 norm is at most C. The server then adds Gaussian
noise of standard deviation z * C (z: the noise multiplier) to the sum of the clipped updates, each
weighing 1: the sum's sensitivity to one device is C, so each round is the Gaussian mechanism with noise
multiplier z (DP-FedAvg, McMahan et al. 2018, user-level privacy).

Accounting: Rényi differential privacy (Mironov 2017). The Gaussian mechanism with multiplier z is
(α, α / (2 z²))-RDP at every order α > 1; T rounds compose to (α, T α / (2 z²)); and (α, ρ)-RDP gives
(ρ + log(1/δ) / (α − 1), δ)-DP. `gaussian_epsilon` takes the best order from a fixed grid. No
amplification by subsampling is claimed (a round's participants are not a Poisson sample of the fleet:
targeting and availability choose them), so the figure is an upper bound that holds whoever is picked.
It is computed here rather than with a library: Google's dp-accounting pins an older attrs than the one
this project's test tools need, and the unamplified Gaussian composition is the closed form above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.update import update_norm

ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128.0, 256.0, 512.0, 1024.0])


def clip_update(delta: Mapping[str, np.ndarray], clip: float) -> dict[str, np.ndarray]:
    """The update scaled by min(1, clip / norm): its global L2 norm is at most `clip`."""
    norm = update_norm(delta)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {name: (np.asarray(a, np.float64) * scale).astype(a.dtype) for name, a in delta.items()}


def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε such that `rounds` rounds of the Gaussian mechanism with this noise multiplier are (ε, δ)-DP."""
    if not noise_multiplier > 0 or rounds < 1 or not 0 < delta < 1:
        raise FleetError(f"privacy accounting needs noise_multiplier > 0, rounds >= 1 and 0 < delta < 1, got "
                         f"{noise_multiplier}, {rounds}, {delta}")
    rho = rounds / (2.0 * noise_multiplier**2)
    return min(rho * a + math.log(1.0 / delta) / (a - 1.0) for a in ORDERS)
