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

import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from edgerun.fleet import schema
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated import round_store as db
from edgerun.fleet.federated import running_sum
from edgerun.fleet.federated.compression import unpack_update
from edgerun.fleet.federated.fedavg import StreamingFedAvg
from edgerun.fleet.federated.privacy import gaussian_epsilon
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


@dataclass(frozen=True)
class Offer:
    """One device's update for `round`: its packed arrays (compression.py; None when the record carrying it
    could not be read: refused as "malformed") and sample count; `record_id` names the stream record it
    came in (collector.py), recorded with its verdict so the record is handed over once."""

    device: str
    round: int
    packed: Mapping[str, np.ndarray] | None
    samples: object
    record_id: str | None = None


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
        # The open round's running sum as this process last committed or read it: ((round, checkpoint), sum).
        self._sum: tuple[tuple[int, str | None], StreamingFedAvg] | None = None
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

    def receive(self, device: str, round_number: int, packed: Mapping[str, np.ndarray], samples: object,
                now: float) -> str:
        """Take one device's update: "accepted", "duplicate", "not_sampled", "round_closed", or the reason
        validation refused it (update.py). Each (round, device) is recorded once; a copy is a duplicate."""
        [verdict] = self.receive_many([Offer(device, round_number, packed, samples)], now)
        return verdict

    def receive_many(self, offers: Iterable[Offer], now: float) -> list[str]:
        """Take updates one at a time from `offers` (an iterator may make each only when asked: a collector
        reading a large update), adding each accepted one to the round's running sum at once; then record
        them all and the new sum together (running_sum.py). Memory: the sum and one update, whatever the
        count. Returns each offer's verdict, as `receive`'s."""
        with self.engine.connect() as conn:
            job = self._job(conn)
            current = conn.execute(sa.select(db.rounds).where(
                (db.rounds.c.job == self.name) & (db.rounds.c.round == job.round))).first()
            seen = {r.device: r.verdict for r in conn.execute(sa.select(db.updates.c.device, db.updates.c.verdict)
                    .where((db.updates.c.job == self.name) & (db.updates.c.round == job.round)))}
        aggregate = self._aggregate(job, current, seen) if current is not None and current.outcome is None else None
        self._sum = None  # changed below: this process's copy is the database's again only once committed
        verdicts: list[str] = []
        rows: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        duplicates = 0
        for offer in offers:
            if offer.packed is None:  # its record could not be read: nothing to hold the device to
                verdict = "malformed"
            elif aggregate is None or current is None or offer.round != job.round or now > current.deadline_at:
                verdict = "round_closed"
            elif offer.device not in current.sampled:
                verdict = "not_sampled"
            elif offer.device in seen:
                verdict = "duplicate"
                duplicates += 1
            else:
                verdict = self._offer(aggregate, offer)
                seen[offer.device] = verdict
                rows.append({"job": self.name, "round": offer.round, "device": offer.device, "verdict": verdict,
                             "samples": int(offer.samples) if verdict == "accepted" else 0,  # type: ignore[call-overload]
                             "received_at": now})
            if offer.record_id is not None:
                records.append({"job": self.name, "device": offer.device, "record_id": offer.record_id,
                                "verdict": verdict})
            verdicts.append(verdict)
        checkpoint = current.sum_checkpoint if current is not None else None
        if rows or records or duplicates:
            checkpoint = self._commit(job, checkpoint, aggregate, rows, records, duplicates)
        if aggregate is not None:
            self._sum = ((job.round, checkpoint), aggregate)
        return verdicts

    def _aggregate(self, job: sa.Row[Any], current: sa.Row[Any], seen: Mapping[str, str]) -> StreamingFedAvg:
        """The open round's running sum, from this process's copy when it is the database's checkpoint."""
        key = (job.round, current.sum_checkpoint)
        if self._sum is not None and self._sum[0] == key:
            return self._sum[1]
        config = JobConfig(**job.config)
        aggregate = StreamingFedAvg(job.round, self._weights(job.version), norm_bound=config.norm_bound,
                                    clip=config.clip, noise_multiplier=config.noise_multiplier, seed=config.seed)
        self._sum = None
        running_sum.load(aggregate, self._round_dir(job.round), current.sum_checkpoint,
                         [d for d, v in seen.items() if v == "accepted"])
        self._sum = (key, aggregate)
        return aggregate

    def _offer(self, aggregate: StreamingFedAvg, offer: Offer) -> str:
        assert offer.packed is not None
        try:
            delta = unpack_update(offer.packed, aggregate.reference)
        except FleetError:
            return "malformed"
        verdict = aggregate.offer(offer.device, delta, offer.samples)  # validated, clipped, added
        return "accepted" if verdict == "applied" else verdict

    def _commit(self, job: sa.Row[Any], checkpoint: str | None, aggregate: StreamingFedAvg | None,
                rows: list[dict[str, Any]], records: list[dict[str, Any]], duplicates: int) -> str | None:
        """Record the updates taken and, when one was accepted, the sum holding them, in one transaction that
        swaps the round's checkpoint from `checkpoint` (what the sum was read as) to the new file; returns
        the round's checkpoint now."""
        added = aggregate is not None and any(r["verdict"] == "accepted" for r in rows)
        round_dir = self._round_dir(job.round)
        new = running_sum.write(aggregate, round_dir) if added and aggregate is not None else checkpoint
        try:
            with self.engine.begin() as conn:
                if added or duplicates:
                    same = (db.rounds.c.sum_checkpoint.is_(None) if checkpoint is None
                            else db.rounds.c.sum_checkpoint == checkpoint)
                    moved = conn.execute(db.rounds.update().where(
                        (db.rounds.c.job == self.name) & (db.rounds.c.round == job.round) & same
                        & db.rounds.c.outcome.is_(None))
                        .values(sum_checkpoint=new, duplicates=db.rounds.c.duplicates + duplicates))
                    if moved.rowcount != 1:
                        raise FleetError(f"round {job.round} of {self.name!r} changed while these updates were "
                                         "taken (closed, or another collector); they are taken again next time")
                if rows:
                    conn.execute(db.updates.insert(), rows)
                if records:
                    conn.execute(db.records.insert(), records)
        except (FleetError, sa.exc.IntegrityError) as error:
            if new != checkpoint:
                (round_dir / str(new)).unlink(missing_ok=True)
            if isinstance(error, FleetError):
                raise
            raise FleetError(f"another process recorded some of these updates to {self.name!r} first; they are "
                             "taken again next time") from None
        if new is not None and new != checkpoint:
            running_sum.prune(round_dir, new)
        return new

    def _round_dir(self, round_number: int) -> Path:
        return self.updates_dir / str(round_number)

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
                (db.updates.c.job == self.name) & (db.updates.c.round == job.round))).all()
        base = self._weights(job.version)
        agg = self._aggregate(job, current, {r.device: r.verdict for r in rows})
        refused = Counter(r.verdict for r in rows if r.verdict != "accepted")
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
        self._sum = None
        shutil.rmtree(self._round_dir(job.round), ignore_errors=True)
        return result

