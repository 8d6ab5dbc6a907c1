"""Cross-replica notification of release changes through PostgreSQL LISTEN/NOTIFY (no other service).

Every transaction that changes what devices are offered (a publish, a step moving, a rollback, an operator's
action) sends `NOTIFY edgerun_fleet_releases` (`announce`); PostgreSQL delivers it to every listening
connection when, and only if, the transaction commits. Each replica keeps one connection listening, on a
thread (`Listener`), and on each notification makes its release watch look at once (push_channel.py), so a
change made through one replica reaches the push streams held by every other without waiting for a poll. A
lost connection is reopened; what changed meanwhile is found by the watch's fallback poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import sqlalchemy as sa

log = logging.getLogger("edgerun.fleet.server")
CHANNEL = "edgerun_fleet_releases"
DEVICES = "edgerun_fleet_devices"  # payload: a device id whose token or groups changed (revoke, set groups)


def announce(conn: sa.Connection) -> None:
    """Tell every replica, at this transaction's commit, that releases changed (PostgreSQL only)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"NOTIFY {CHANNEL}"))


def announce_device(conn: sa.Connection, device_id: str) -> None:
    """Tell every replica, at commit, to forget what it cached of this device (its token, its groups)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_notify(:c, :d)"), {"c": DEVICES, "d": device_id})


class Listener:
    def __init__(self, engine: sa.Engine, on_notify: Callable[[], None], on_device: Callable[[str], None],
                 retry_s: float = 1.0) -> None:
        self.conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.on_notify, self.on_device, self.retry_s = on_notify, on_device, retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-release-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {DEVICES}")
                    self.on_notify()  # changes made while not listening are found by this look
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            if n.channel == DEVICES:
                                self.on_device(n.payload)
                            else:
                                self.on_notify()
            except Exception as exc:  # a restarting database: listen again shortly
                log.warning("release notifications lost; listening again", extra={"error": repr(exc)})
                self._stop.wait(self.retry_s)
