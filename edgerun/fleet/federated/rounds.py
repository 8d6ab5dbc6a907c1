"""Federated rounds on the server: sample devices, collect their updates until a quorum or a deadline, drop
the stragglers, aggregate, evaluate on the operator's held-out set, publish or roll back.

A `FederatedJob` is a state machine over the database (`round_store.py`); every method reads the state it
needs from there, so a job object may be dropped and made again (a server restart) at any point. Time is
an argument (`now`), never read from the clock here. Devices are sampled among those the job's targeting
matches (the release targeting of `targeting.py`), by a generator seeded with (job seed, round), so a
round's participants are reproducible. With `idle_and_charging` only devices whose last check-in said they
were idle and charging (their profile's fields, device_state.py) are sampled; `fleet_devices` reads the
profiles the fleet server stored.

A round closes when `quorum` accepted updates are in or its deadline has passed. Sampled devices that sent
nothing by then are stragglers: counted and dropped; an update arriving after the close is refused as
`round_closed`. The new global weights are evaluated by the operator's `evaluate(weights) -> metric`
(held-out accuracy: higher is better). A round whose metric falls more than `max_drop` below the best
published one is rolled back: nothing is published and the global weights stay the last good version's.
Otherwise the weights become the next version and `publish(version, weights)` ships them (through the
fleet's signed, staged releases: `publisher.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from edgerun.fleet import schema
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated import round_store as db
from edgerun.fleet.federated.compression import unpack_update
from edgerun.fleet.federated.fedavg import StreamingFedAvg
from edgerun.fleet.federated.privacy import gaussian_epsilon
from edgerun.fleet.federated.update import validate_update
from edgerun.fleet.targeting import DeviceProfile, matches, validate_targeting


@dataclass(frozen=True)
class JobConfig:
    """A federated job: which devices, how many per round, when a round closes, what an update may be."""

    name: str
    rounds: int = 10
    per_round: int = 8                       # devices sampled each round
    quorum: int = 8                          # accepted updates that close a round early
    deadline_s: float = 600.0                # a round closes this long after it opened, quorum or not
    targeting: dict[str, Any] = field(default_factory=lambda: {"kind": "uniform"})
    norm_bound: float | None = None          # updates with a larger global L2 norm are refused
    clip: float | None = None                # per-update clipping (privacy.py)
    noise_multiplier: float = 0.0
    max_drop: float = 0.05                   # a metric this far below the best published one rolls back
    seed: int = 0
    epochs: int = 1                          # local epochs, sent to the devices with the round
    mu: float = 0.0                          # FedProx's proximal weight, sent likewise
    server_lr: float = 1.0                   # new global = global + server_lr * the weighted mean delta
    dp_delta: float = 1e-5                   # the delta of the (epsilon, delta) the status reports with noise on
    idle_and_charging: bool = False          # sample only devices whose last check-in said idle and charging

    def __post_init__(self) -> None:
        if not self.name or self.rounds < 1 or self.per_round < 1 or not 1 <= self.quorum <= self.per_round:
            raise FleetError(f"a federated job needs a name, rounds >= 1 and 1 <= quorum <= per_round, got {self}")
        if not self.server_lr > 0:
            raise FleetError(f"the server learning rate must be > 0, got {self.server_lr}")
        if not self.deadline_s > 0:
            raise FleetError(f"the round deadline must be > 0 seconds, got {self.deadline_s}")
        validate_targeting(self.targeting)


@dataclass
class RoundResult:
    round: int
    outcome: str                             # published | rolled_back | empty
    version: int                             # the global version after the round
    participants: int
    samples: int
    refused: dict[str, int]
    duplicates: int
    stragglers: int
    metric: float | None


def fleet_devices(engine: sa.Engine, seen_since: float) -> list[DeviceProfile]:
    """The fleet's devices seen at `seen_since` or later, each with the profile of its last check-in (app,
    OS, user groups, idle, charging) and the device groups the admin gave it: what `open_round` samples from."""
    table = schema.devices
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.profile, table.c.device_groups)
                            .where(table.c.last_seen >= seen_since).order_by(table.c.id)).all()
    return [replace(DeviceProfile.from_dict(row.profile), device_groups=tuple(row.device_groups)) for row in rows]


class FederatedJob:
    """One federated job in the fleet database; `updates_dir` holds the accepted updates of open rounds."""

    def __init__(self, engine: sa.Engine, name: str, updates_dir: str | Path) -> None:
        self.engine = engine
        self.name = name
        self.updates_dir = Path(updates_dir) / name
        # A version's weights never change once written, so each process keeps the latest it read:
        # receiving an update then reads no weights from the database.
        self._cached: tuple[int, dict[str, np.ndarray]] | None = None
        db.require_tables(engine)

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def start(cls, engine: sa.Engine, config: JobConfig, initial: Mapping[str, np.ndarray],
              updates_dir: str | Path) -> FederatedJob:
        """Create the job with its version-1 global weights (refused if a job of that name exists)."""
        db.require_tables(engine)
        with engine.begin() as conn:
            if conn.execute(sa.select(db.jobs.c.name).where(db.jobs.c.name == config.name)).first():
                raise FleetError(f"federated job {config.name!r} already exists")
            conn.execute(db.jobs.insert().values(name=config.name, config=asdict(config), status="running",
                                                 round=1, version=1, best_metric=None))
            conn.execute(db.weights.insert().values(job=config.name, version=1, data=db.to_npz(initial)))
        return cls(engine, config.name, updates_dir)

    def _job(self, conn: sa.Connection) -> sa.Row[Any]:
        row = conn.execute(sa.select(db.jobs).where(db.jobs.c.name == self.name)).first()
        if row is None:
            raise FleetError(f"no federated job {self.name!r}")
        return row

    @property
    def config(self) -> JobConfig:
        with self.engine.connect() as conn:
            return JobConfig(**self._job(conn).config)

    def stop(self) -> None:
        with self.engine.begin() as conn:
            self._job(conn)
            conn.execute(db.jobs.update().where(db.jobs.c.name == self.name).values(status="stopped"))

    def status(self) -> dict[str, Any]:
        """The job's state and every closed round's summary."""
        with self.engine.connect() as conn:
            job = self._job(conn)
            done = conn.execute(sa.select(db.rounds).where(db.rounds.c.job == self.name)
                                .order_by(db.rounds.c.round)).all()
        config = JobConfig(**job.config)
        status = {"name": self.name, "status": job.status, "round": job.round, "version": job.version,
                  "best_metric": job.best_metric,
                  "rounds": [{"round": r.round, "outcome": r.outcome, **(r.summary or {})} for r in done]}
        if config.noise_multiplier:
            # every round that aggregated released a noisy sum, published or rolled back
            noisy = sum(1 for r in done if r.outcome in ("published", "rolled_back"))
            status["privacy"] = {"clip": config.clip, "noise_multiplier": config.noise_multiplier,
                                 "rounds": noisy, "delta": config.dp_delta,
                                 "epsilon": gaussian_epsilon(config.noise_multiplier, noisy, config.dp_delta)
                                 if noisy else 0.0}
        return status

    def global_weights(self, version: int | None = None) -> dict[str, np.ndarray]:
        """The global weights of `version` (default: the current one); a copy the caller may change."""
        return {name: a.copy() for name, a in self._weights(version).items()}

    def _weights(self, version: int | None = None) -> dict[str, np.ndarray]:
        """The weights themselves, shared with the cache: read them, never change them."""
        with self.engine.connect() as conn:
            version = self._job(conn).version if version is None else version
            if self._cached is not None and self._cached[0] == version:
                return self._cached[1]
            row = conn.execute(sa.select(db.weights.c.data).where(
                (db.weights.c.job == self.name) & (db.weights.c.version == version))).first()
        if row is None:
            raise FleetError(f"federated job {self.name!r} has no version {version}")
        self._cached = (version, db.from_npz(row.data))
        return self._cached[1]

    # -- a round -----------------------------------------------------------------------------------
    def open_round(self, devices: Sequence[DeviceProfile], now: float) -> list[str]:
        """Sample this round's devices among `devices` (those seen lately) that the targeting matches; the
        open round's sample if it is already open."""
        config = self.config
        with self.engine.begin() as conn:
            job = self._job(conn)
            if job.status != "running":
                raise FleetError(f"federated job {self.name!r} is {job.status}")
            existing = conn.execute(sa.select(db.rounds).where(
                (db.rounds.c.job == self.name) & (db.rounds.c.round == job.round))).first()
            if existing is not None:
                return list(existing.sampled)
            eligible = sorted(d.device_id for d in devices if matches(config.targeting, d)
                              and ((d.idle and d.charging) or not config.idle_and_charging))
            if not eligible:
                raise FleetError(f"no device matches federated job {self.name!r}'s targeting"
                                 + (" and is idle and charging" if config.idle_and_charging else ""))
            rng = np.random.default_rng([config.seed, job.round])
            picked = sorted(rng.choice(eligible, size=min(config.per_round, len(eligible)), replace=False).tolist())
            conn.execute(db.rounds.insert().values(job=self.name, round=job.round, sampled=picked, opened_at=now,
                                                   deadline_at=now + config.deadline_s, outcome=None))
        return picked

    def _open(self, conn: sa.Connection) -> tuple[sa.Row[Any], sa.Row[Any]]:
        job = self._job(conn)
        row = conn.execute(sa.select(db.rounds).where(
            (db.rounds.c.job == self.name) & (db.rounds.c.round == job.round))).first()
        if row is None:
            raise FleetError(f"federated job {self.name!r} has no open round")
        return job, row

    def receive(self, device: str, round_number: int, packed: Mapping[str, np.ndarray], samples: int,
                now: float) -> str:
        """Take one device's update: "accepted", "duplicate", "not_sampled", "round_closed", or the reason
        validation refused it (update.py). Each (round, device) is recorded once; a copy is a duplicate."""
        config = self.config
        with self.engine.begin() as conn:
            job = self._job(conn)
            current = conn.execute(sa.select(db.rounds).where(
                (db.rounds.c.job == self.name) & (db.rounds.c.round == round_number))).first()
            if current is None or round_number != job.round or current.outcome is not None \
                    or now > current.deadline_at:
                return "round_closed"
            if device not in current.sampled:
                return "not_sampled"
            seen = conn.execute(sa.select(db.updates.c.verdict).where(
                (db.updates.c.job == self.name) & (db.updates.c.round == round_number)
                & (db.updates.c.device == device))).first()
            if seen is not None:
                conn.execute(db.rounds.update().where((db.rounds.c.job == self.name) & (db.rounds.c.round == round_number))
                             .values(duplicates=db.rounds.c.duplicates + 1))
                return "duplicate"
            reference = self._weights(job.version)
            try:
                delta = unpack_update(packed, reference)
                verdict = validate_update(delta, samples, reference, config.norm_bound) or "accepted"
            except FleetError:
                delta, verdict = {}, "malformed"
            if verdict == "accepted":
                path = self._update_path(round_number, device)
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".part")
                partial.write_bytes(db.to_npz(delta))
                partial.replace(path)  # the file is whole before its row commits
            try:
                with conn.begin_nested():  # a savepoint: the transaction stays usable if the insert clashes
                    conn.execute(db.updates.insert().values(job=self.name, round=round_number, device=device,
                                                            samples=int(samples) if verdict == "accepted" else 0,
                                                            verdict=verdict, received_at=now))
            except sa.exc.IntegrityError:
                return "duplicate"  # the same update, stored by another server process a moment ago
        return verdict

    def _update_path(self, round_number: int, device: str) -> Path:
        return self.updates_dir / str(round_number) / f"{device}.npz"

    def ready(self, now: float) -> bool:
        """Whether the open round may close: quorum reached or deadline passed."""
        config = self.config
        with self.engine.connect() as conn:
            job, current = self._open(conn)
            accepted = conn.execute(sa.select(sa.func.count()).select_from(db.updates).where(
                (db.updates.c.job == self.name) & (db.updates.c.round == job.round)
                & (db.updates.c.verdict == "accepted"))).scalar_one()
        return accepted >= config.quorum or now >= current.deadline_at

    def close_round(self, evaluate: Callable[[dict[str, np.ndarray]], float],
                    publish: Callable[[int, dict[str, np.ndarray]], object] | None = None) -> RoundResult:
        """Aggregate the open round's accepted updates (streamed from their files), evaluate, publish or
        roll back, and move to the next round."""
        config = self.config
        with self.engine.connect() as conn:
            job, current = self._open(conn)
            rows = conn.execute(sa.select(db.updates).where(
                (db.updates.c.job == self.name) & (db.updates.c.round == job.round))
                .order_by(db.updates.c.device)).all()
        base = self._weights(job.version)
        agg = StreamingFedAvg(job.round, base, norm_bound=config.norm_bound, clip=config.clip,
                              noise_multiplier=config.noise_multiplier, seed=config.seed)
        refused = Counter(r.verdict for r in rows if r.verdict != "accepted")
        for r in rows:
            if r.verdict == "accepted":
                agg.offer(r.device, db.from_npz(self._update_path(job.round, r.device).read_bytes()), r.samples)
        responded = {r.device for r in rows}
        stragglers = len([d for d in current.sampled if d not in responded])
        metric = None
        version, best = job.version, job.best_metric
        if agg.applied == 0:
            outcome = "empty"
        else:
            new = agg.apply_to(base, config.server_lr)
            metric = float(evaluate(new))
            if best is not None and metric < best - config.max_drop:
                outcome = "rolled_back"
            else:
                outcome, version = "published", job.version + 1
                best = metric if best is None else max(best, metric)
                with self.engine.begin() as conn:  # a close retried after a crash writes the same version again
                    conn.execute(db.weights.delete().where((db.weights.c.job == self.name)
                                                           & (db.weights.c.version == version)))
                    conn.execute(db.weights.insert().values(job=self.name, version=version, data=db.to_npz(new)))
                if publish is not None:
                    publish(version, new)
        result = RoundResult(job.round, outcome, version, agg.applied, agg.total_samples, dict(refused),
                             duplicates=current.duplicates, stragglers=stragglers, metric=metric)
        summary = {k: v for k, v in asdict(result).items() if k not in ("round", "outcome")}
        with self.engine.begin() as conn:
            conn.execute(db.rounds.update().where((db.rounds.c.job == self.name) & (db.rounds.c.round == job.round))
                         .values(outcome=outcome, summary=summary))
            done = job.round >= config.rounds
            conn.execute(db.jobs.update().where(db.jobs.c.name == self.name).values(
                round=job.round + 1, version=version, best_metric=best,
                status="done" if done else job.status))
        for r in rows:
            self._update_path(job.round, r.device).unlink(missing_ok=True)
        return result

