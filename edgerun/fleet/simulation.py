"""Cloud simulation stage: run a new release in N simulated agents on the server before any device gets it.

Each simulated agent materialises the release's files from the store and runs the task in the same
compute container the devices use, once per input in the task config's `simulation.inputs`. A lease
column lets any server process pick up a simulation whose runner died, so no release stays in
'simulation' forever (the Argo #942 "stuck progressing" lesson).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.container import Limits, run_in_container
from edgerun.fleet.schema import releases
from edgerun.fleet.store import BlobStore

LEASE_S = 120.0

log = logging.getLogger("edgerun.fleet.server")


def materialise(store: BlobStore, manifest: dict[str, Any], dest: Path) -> None:
    for f in manifest["files"]:
        target = dest / f["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get(f["sha256"]))


def simulate_release(store: BlobStore, manifest: dict[str, Any], agents: int) -> tuple[bool, str]:
    config = manifest["config"]
    inputs = config.get("simulation", {}).get("inputs") or [{}]
    limits = config.get("limits", {})
    with tempfile.TemporaryDirectory(prefix="edgerun-sim-") as tmp:
        materialise(store, manifest, Path(tmp))
        os.chmod(tmp, 0o755)  # each run reads it under its own uid

        def one_agent(i: int) -> str:
            for inp in inputs:
                r = run_in_container(tmp, config.get("entry", "main.py"), inp, limits=Limits.from_config(limits),
                                     network=bool(config.get("network", False)))
                if not r.ok:
                    return f"agent {i}: {r.outcome}: {r.error.strip().splitlines()[-1] if r.error else ''}"
            return ""

        with ThreadPoolExecutor(max_workers=min(agents, 4)) as pool:
            failures = [f for f in pool.map(one_agent, range(agents)) if f]
    if failures:
        return False, f"{len(failures)}/{agents} simulated agents failed; {failures[0]}"
    return True, f"{agents} simulated agents × {len(inputs)} input(s) passed"


def claim_simulation(engine: sa.Engine) -> int | None:
    """Take the lease on one release waiting in simulation, or None."""
    now = time.time()
    with engine.begin() as conn:
        row = conn.execute(sa.select(releases.c.id).where(releases.c.stage == "simulation",
                                                          releases.c.sim_lease_until < now).limit(1)).first()
        if row is None:
            return None
        taken = conn.execute(releases.update().where(releases.c.id == row.id, releases.c.sim_lease_until < now)
                             .values(sim_lease_until=now + LEASE_S)).rowcount
    return int(row.id) if taken else None


def run_pending_simulations(engine: sa.Engine, store: BlobStore) -> int:
    done = 0
    while (release_id := claim_simulation(engine)) is not None:
        with engine.connect() as conn:
            row = conn.execute(sa.select(releases).where(releases.c.id == release_id)).one()
        policy = rollout.RolloutPolicy.from_dict(row.policy)
        passed, detail = simulate_release(store, row.envelope["signed"], policy.simulation_agents)
        with engine.begin() as conn:
            locked = rel.lock_release(conn, release_id)
            new = rollout.simulation_finished(rel.state_of(locked), policy, passed, detail)
            rel.write_audit(conn, "simulator", "simulation:" + ("pass" if passed else "fail"), release_id, detail)
            rel.save_transition(conn, locked, new, "simulator")
        done += 1
    return done


class SimulationWorker:
    """A background thread per server process that runs waiting simulations; `kick` wakes it."""

    def __init__(self, engine: sa.Engine, store: BlobStore, on_change: Any = None) -> None:
        self.engine, self.store, self.on_change = engine, store, on_change
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-simulator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=5.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if run_pending_simulations(self.engine, self.store) and self.on_change:
                    self.on_change()
            except Exception as exc:  # a failing store or DB must not kill the worker; the lease retries
                log.warning("simulation failed", extra={"error": repr(exc)})
