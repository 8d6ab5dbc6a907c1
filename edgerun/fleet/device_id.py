"""What a device id may be: 1 to 128 characters of ASCII letters, digits, `.`, `_` and `-`, starting with a
letter or digit.

An id is a path segment of the device's own URLs (`/v1/devices/<id>/checkin`), a key in PostgreSQL and
SQLite, a name in logs and on the dashboard: `/` could never check in, `..` reads as a path step, NUL fails
on PostgreSQL, CR/LF forges log lines, and U+202E reverses what an operator reads. Checked by the server
at enrolment (and for enrolment tokens scoped to an id) and by the agent before it asks.
"""

from __future__ import annotations

import re

from edgerun.fleet.errors import FleetError

DEVICE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)


def is_device_id(value: object) -> bool:
    return isinstance(value, str) and _DEVICE_ID.fullmatch(value) is not None


def check_device_id(value: str) -> str:
    """`value` if it is a valid device id, else a FleetError naming the rule."""
    if not is_device_id(value):
        raise FleetError(f"device id {value[:40]!r} is not 1 to 128 characters of letters, digits, '.', '_' "
                         "and '-' starting with a letter or digit")
    return value
