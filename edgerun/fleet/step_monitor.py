"""Keeps running beta and gray steps current with the devices live now, without waiting for a report.

Report batches evaluate a step against its stored population; this monitor recounts it (a SQL count over
the device bucket range, releases.step_population) and stores it, advancing or rolling back a step that now
has all the evidence it can get (its remaining devices reported, others left the liveness window). The count
runs without any lock; only a change takes the release's row lock, re-reads the row and applies the count
if the step did not move meanwhile, so a monitor and a report batch at once still make one transition.

One monitor works at a time across replicas (`Leadership`): on PostgreSQL the replica holding a session
advisory lock on a connection of its own. If that replica dies, its connection is killed or the database
restarts, PostgreSQL drops the lock and the next replica whose tick tries takes over; counts stay exact
because every transition is still made under the row lock. On SQLite (one host) every process monitors.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable

import sqlalchemy as sa

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.schema import releases

log = logging.getLogger("edgerun.fleet.server")
MONITOR_LOCK = int.from_bytes(hashlib.sha256(b"edgerun-fleet-step-monitor").digest()[:8], "big", signed=True)


def refresh_steps(engine: sa.Engine) -> int:
    """Recount and evaluate every running step once; returns how many releases changed stage or step."""
    plans: list[tuple[int, str, int, int]] = []
    with engine.connect() as conn:
        for row in conn.execute(sa.select(releases).where(releases.c.stage.in_(("beta", "gray")))).all():
            policy = rollout.RolloutPolicy.from_dict(row.policy)
            state = rel.state_of(row)
            population = rel.step_population(conn, row.task, row.version, row.targeting, policy, state)
            counted = rollout.recount(state, policy, population)
            if counted.events or population != row.step_population:
                plans.append((row.id, row.stage, row.step, population))
    moved = 0
    for release_id, stage, step, population in plans:
        with engine.begin() as conn:
            row = rel.lock_release(conn, release_id)
            if (row.stage, row.step) != (stage, step):
                continue  # a report batch or an operator moved it meanwhile; the next tick counts again
            new = rollout.recount(rel.state_of(row), rollout.RolloutPolicy.from_dict(row.policy), population)
            if new.events or new.population != row.step_population:
                rel.save_transition(conn, row, new, "monitor")
                moved += bool(new.events)
    return moved


class Leadership:
    """Who runs the step monitor: on PostgreSQL the holder of a session advisory lock, kept on a connection of
    its own for as long as it leads; elsewhere always this process."""

    def __init__(self, engine: sa.Engine, key: int = MONITOR_LOCK) -> None:
        self.engine, self.key = engine, key
        self._conn: sa.Connection | None = None
        self.backend_pid = 0  # the PostgreSQL backend holding the lock (operators, tests)

    def held(self) -> bool:
        """Whether this process leads now: checks the held lock's connection is alive, else tries to take it."""
        if self.engine.dialect.name != "postgresql":
            return True
        if self._conn is not None:
            try:
                self._conn.execute(sa.text("SELECT 1"))
                return True
            except sa.exc.DBAPIError:
                log.warning("step monitor: lost leadership (its database connection ended)")
                self._drop()
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
            if got:
                self.backend_pid = int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar() or 0)
                self._conn = conn
                log.info("step monitor: leading", extra={"backend_pid": self.backend_pid})
                return True
        except BaseException:
            conn.invalidate()
            conn.close()
            raise
        conn.close()
        return False

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.invalidate()  # never back to the pool: a pooled connection would keep the lock
            self._conn.close()
            self._conn, self.backend_pid = None, 0

    def release(self) -> None:
        self._drop()  # closing the session releases its advisory lock


class StepMonitor:
    def __init__(self, engine: sa.Engine, interval_s: float, on_change: Callable[[], None],
                 leadership: Leadership | None = None, on_round: Callable[[bool], object] | None = None) -> None:
        self.engine, self.interval_s, self.on_change = engine, interval_s, on_change
        self.on_round = on_round  # told after each round whether this process led it (metrics)
        self.leadership = leadership or Leadership(engine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-step-monitor", daemon=True)

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.leadership.release()

    def tick(self) -> int | None:
        """One round: None when another replica leads, else how many releases moved."""
        leading = self.leadership.held()
        if self.on_round is not None:
            self.on_round(leading)
        if not leading:
            return None
        moved = refresh_steps(self.engine)
        if moved:
            self.on_change()
        return moved

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as exc:  # a busy or restarting database must not end the loop; the next tick retries
                log.warning("step monitor failed", extra={"error": repr(exc)})
