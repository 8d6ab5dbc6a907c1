"""Federated learning through the fleet (docs/federated.md): devices train on their own data and the server
aggregates their weight updates into the next global model.

The aggregation core is pure numpy: validation of each update (`update.py`), the streaming weighted average
(`fedavg.py`), clipping with Gaussian noise and its privacy accounting (`privacy.py`), update compression
(`compression.py`) and the local training a device runs (`local.py`).
"""

from edgerun.fleet.federated.compression import pack_update, unpack_update
from edgerun.fleet.federated.fedavg import StreamingFedAvg, fedavg
from edgerun.fleet.federated.privacy import clip_update, gaussian_epsilon
from edgerun.fleet.federated.update import REFUSAL_REASONS, validate_update

__all__ = ["REFUSAL_REASONS", "StreamingFedAvg", "clip_update", "fedavg", "gaussian_epsilon", "pack_update",
           "unpack_update", "validate_update"]
