"""A round's running FedAvg sum on disk, so updates are added as they arrive and never kept.

The sum (float64, twice the model's float32 size) is written whole under a name of its own (`sum-<random>.npz`,
fsynced, then renamed into place) before one transaction records the updates it adds and swaps the round's
`sum_checkpoint` from the name it was read under to the new one (rounds.py); the swap fails if anyone moved
it meanwhile, and the writer then removes its file and records nothing. A crash before the commit leaves the
old checkpoint current and the updates unrecorded, so they are collected and added again; the new file is
an orphan, removed with the older checkpoints at the next commit. Names are never reused, so no writer
can overwrite a checkpoint another one committed. So each recorded update is in the sum exactly once, and
a round of N updates needs the sum, one update and their temporaries in memory, whatever N is.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.fedavg import StreamingFedAvg


def load(aggregate: StreamingFedAvg, round_dir: Path, name: str | None, devices: Iterable[str]) -> None:
    """Bring a fresh `aggregate` to checkpoint `name` (None: nothing added yet), which holds `devices`' updates."""
    if name is None:
        return
    path = round_dir / name
    try:
        with np.load(path, allow_pickle=False) as archive:
            aggregate.restore(archive, devices)
    except FileNotFoundError:
        raise FleetError(f"the running sum of round {aggregate.round} ({path}) is missing") from None


def write(aggregate: StreamingFedAvg, round_dir: Path) -> str:
    """Write `aggregate` whole under a new name, which it returns."""
    round_dir.mkdir(parents=True, exist_ok=True)
    name = f"sum-{secrets.token_hex(8)}.npz"
    partial = round_dir / f"{name}.part"
    with open(partial, "wb") as f:
        np.savez(f, **aggregate.checkpoint())  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
    partial.replace(round_dir / name)
    return name


def prune(round_dir: Path, current: str) -> None:
    """Remove every checkpoint but `current`: older ones, and orphans of failed or interrupted commits (a
    writer still before its commit then fails it, since `current` replaced the name it read)."""
    for path in round_dir.glob("sum-*"):
        if path.name != current:
            path.unlink(missing_ok=True)
