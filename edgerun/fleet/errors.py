"""Errors the fleet platform raises on purpose; all derive from EdgerunError so the CLI prints them cleanly."""

from __future__ import annotations

from edgerun.errors import EdgerunError


class FleetError(EdgerunError):
    """A user-facing fleet error: bad package, unreachable server, refused request."""


class SignatureError(FleetError):
    """Metadata is unsigned, signed by a key the trusted root does not name, or below threshold."""


class ExpiredError(FleetError):
    """Signed metadata is past its expiry time."""


class RollbackAttackError(FleetError):
    """Metadata carries a version lower than one the device has already seen."""


class IntegrityError(FleetError):
    """A downloaded file does not match the length or SHA-256 its manifest promises."""
