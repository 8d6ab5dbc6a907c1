"""Device-time model of one Edge-TPU-class `npu`: the seed's Table 1 (OPS, RPS per operator) and its transfer rate.

Nothing here is measured on our machines: these are the seed's figures, used to report what the same
instruction stream would cost on the device. An instruction costs the larger of one operation (1/OPS) and
its results at the operator's results-per-second (RPS), so batching more results into one instruction never
makes it cheaper than the RPS allows. Moving data costs about 6 ms per MB (8 MB in 48 ms).
"""

from __future__ import annotations

# operator: (OPS, RPS), Table 1 of the seed (Hsu & Tseng, SC'21).
TABLE1: dict[str, tuple[float, float]] = {
    "conv2D": (10268.80, 168240326.89),
    "FullyConnected": (51924.96, 6646394.57),
    "sub": (6273.28, 82871343.60),
    "add": (6203.52, 98293633.48),
    "mul": (14515.84, 216469999.54),
    "crop": (4867.96, 1562904391.76),
    "ext": (1604.78, 3637240203.38),
    "mean": (408.54, 408.54),
    "max": (477.08, 477.08),
    "tanh": (3232.31, 2148232470.28),
    "ReLU": (11194.26, 4043196115.38),
}
OPERATORS: frozenset[str] = frozenset(TABLE1)
SECONDS_PER_BYTE = 6e-3 / (1 << 20)  # ~6 ms per MB host<->device (~167 MB/s)


def instruction_seconds(op: str, results: int) -> float:
    """Modelled compute time of one instruction of `op` that produces `results` values."""
    ops, rps = TABLE1[op]
    return max(1.0 / ops, results / rps)


def transfer_seconds(nbytes: int) -> float:
    """Modelled time to move `nbytes` between host and device memory."""
    return nbytes * SECONDS_PER_BYTE
