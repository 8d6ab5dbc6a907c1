"""Freshness, as TUF's timestamp role: every "up to date" answer carries a short-lived signed timestamp.

Without it, an "up to date" answer is an unsigned word that a man in the middle can replay for ever to hide
a new release (a freeze attack). The timestamp is signed by the online `assignment` key (the server holds no
other), names the device, carries a serial from the same counter as assignments (so the device refuses one
older than what it has already seen) and expires after `TIMESTAMP_LIFETIME_S`:

    {"_type": "timestamp", "device_id", "serial", "root_version", "expires"}
"""

from __future__ import annotations

from typing import Any

from edgerun.fleet.canonical import iso_after
from edgerun.fleet.errors import SignatureError
from edgerun.fleet.manifest import verify_device_metadata
from edgerun.fleet.signing import Root, SigningKey, sign_envelope

TIMESTAMP_LIFETIME_S = 600.0


def sign_timestamp(device_id: str, serial: int, root_version: int, key: SigningKey,
                   lifetime_s: float = TIMESTAMP_LIFETIME_S) -> dict[str, Any]:
    signed = {"_type": "timestamp", "device_id": device_id, "serial": serial, "root_version": root_version,
              "expires": iso_after(lifetime_s)}
    return sign_envelope(signed, [key])


def verify_timestamp(root: Root, envelope: Any, *, device_id: str, min_serial: int = 0) -> dict[str, Any]:
    """Signed by the assignment role, for this device, not expired, and not older than a serial seen."""
    if not isinstance(envelope, dict):
        raise SignatureError("an 'up to date' answer without a signed timestamp is not trusted")
    return verify_device_metadata(root, envelope, "timestamp", device_id=device_id, min_serial=min_serial)
