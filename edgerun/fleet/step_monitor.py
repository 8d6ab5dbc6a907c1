"""Re-evaluates running beta and gray steps against the devices live now, without waiting for a report.

Report batches already recount a step's population, but a step whose remaining devices have all reported
gets no more batches: when others then leave (their last check-in ages past the liveness window) only a
periodic look can notice that the step now has all the evidence it can get, and advance it or roll it back.
Every server process runs one; a step is re-read under its row lock before it changes, so two monitors (or a
monitor and a report batch) at once still make one transition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.schema import releases


def refresh_steps(engine: sa.Engine) -> int:
    """Recount and evaluate every running step once; returns how many releases changed stage or step."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(releases).where(releases.c.stage.in_(("beta", "gray")))).all()
        # A cheap look without locks first: most ticks change nothing and must not take the write lock.
        stale = [row.id for row in rows if _would_change(conn, row)]
    moved = 0
    for release_id in stale:
        with engine.begin() as conn:
            row = rel.lock_release(conn, release_id)
            if row.stage not in ("beta", "gray"):
                continue  # another process or a report batch got there first
            policy = rollout.RolloutPolicy.from_dict(row.policy)
            live = rel.live_state(conn, row, policy)
            new = rollout.recount(live, policy, live.population)
            if new.events or new.population != row.step_population:
                rel.save_transition(conn, row, new, "monitor")
                moved += bool(new.events)
    return moved


def _would_change(conn: sa.Connection, row: sa.Row[Any]) -> bool:
    policy = rollout.RolloutPolicy.from_dict(row.policy)
    live = rel.live_state(conn, row, policy)
    return live.population != row.step_population or bool(rollout.recount(live, policy, live.population).events)


class StepMonitor:
    def __init__(self, engine: sa.Engine, interval_s: float, on_change: Callable[[], None]) -> None:
        self.engine, self.interval_s, self.on_change = engine, interval_s, on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-step-monitor", daemon=True)

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if refresh_steps(self.engine):
                    self.on_change()
            except Exception as exc:  # a busy database must not end the loop; the next tick retries
                print(f"fleet server: step monitor failed: {exc!r}", flush=True)
