"""Release records on the server: publishing, operator actions, and persisting rollout transitions.

Every transition is read-modify-written under a row lock in one transaction, so two server processes
seeing two breaching report batches at once still produce exactly one rollback (hawkBit PR #2161), and
a release is created in its first real stage in the same transaction that stores it, so there is no
'creating' state to get stuck in (hawkBit #1770).
"""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from edgerun.fleet import rollout
from edgerun.fleet.errors import FleetError
from edgerun.fleet.manifest import validate_release_manifest, verify_release
from edgerun.fleet.release_notify import announce
from edgerun.fleet.schema import audit, devices, releases, roots
from edgerun.fleet.signing import Root
from edgerun.fleet.store import BlobStore
from edgerun.fleet.targeting import (
    DeviceProfile,
    is_plain_uniform,
    matches,
    release_offset,
    step_ranges,
    validate_targeting,
)


def write_lock(conn: sa.Connection, key: str) -> None:
    """Serialise transactions on `key`: an advisory lock on PostgreSQL; SQLite's single write lock, taken
    by a write that changes nothing, before anything is read (so the reads see the latest commit)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                     {"k": int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)})
    else:
        conn.execute(roots.update().where(sa.false()).values(version=roots.c.version))


def write_audit(conn: sa.Connection, actor: str, action: str, release_id: int | None, detail: str = "") -> None:
    conn.execute(audit.insert().values(at=time.time(), actor=actor, release_id=release_id,
                                       action=action, detail=detail))


def lock_release(conn: sa.Connection, release_id: int) -> sa.Row[Any]:
    """Take the row lock before reading, so the read-modify-write cannot interleave with another."""
    query = sa.select(releases).where(releases.c.id == release_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    else:
        # SQLite: a write first takes the database write lock for the rest of the transaction.
        conn.execute(releases.update().where(releases.c.id == release_id).values(updated_at=releases.c.updated_at))
    row = conn.execute(query).first()
    if row is None:
        raise FleetError(f"no release #{release_id}")
    return row


def state_of(row: sa.Row[Any]) -> rollout.RolloutState:
    return rollout.RolloutState(stage=row.stage, step=row.step, paused=row.paused,
                                step_success=row.step_success, step_failure=row.step_failure, reason=row.reason,
                                population=row.step_population)


def step_population(conn: sa.Connection, task: str, version: int, targeting: dict[str, Any],
                    policy: rollout.RolloutPolicy, state: rollout.RolloutState) -> int:
    """Active devices (seen within the policy's window) that the current step covers: beta devices by id,
    gray ones by a range of the stored device bucket (index `ix_devices_bucket_seen`). A release targeting
    everyone is a bare SQL count; other targeting reads the profiles of the step's devices only."""
    if state.stage not in ("beta", "gray"):
        return 0
    since = time.time() - policy.active_window_s
    beta = sorted(set(policy.beta_devices))
    live = devices.c.last_seen >= since
    n = 0
    if beta:
        n += _matching(conn, targeting, sa.and_(live, devices.c.id.in_(beta)))
    ranges = step_ranges(release_offset(task, version), rollout.exposure_percent(state, policy))
    if state.stage == "gray" and ranges:
        covered = sa.and_(live, sa.or_(*(sa.and_(devices.c.bucket >= lo, devices.c.bucket < hi) for lo, hi in ranges)),
                          *([devices.c.id.not_in(beta)] if beta else []))
        if is_plain_uniform(targeting):
            n += int(conn.execute(sa.select(sa.func.count()).select_from(devices).where(covered)).scalar() or 0)
        else:
            n += _matching(conn, targeting, covered)
    return n


def _matching(conn: sa.Connection, targeting: dict[str, Any], where: sa.ColumnElement[bool]) -> int:
    rows = conn.execute(sa.select(devices.c.profile, devices.c.device_groups).where(where))
    return sum(1 for profile, groups in rows
               if matches(targeting, DeviceProfile.from_dict({**profile, "device_groups": groups})))


def count_population(conn: sa.Connection, task: str, version: int, targeting: dict[str, Any],
                     policy: rollout.RolloutPolicy, state: rollout.RolloutState) -> rollout.RolloutState:
    """Count who the step covers now; steps that cover nobody are skipped (each skip is audited)."""
    while True:
        state = replace(state, population=step_population(conn, task, version, targeting, policy, state))
        moved = rollout.skip_empty_step(state, policy)
        if moved is state:
            return state
        state = moved


def save_transition(conn: sa.Connection, row: sa.Row[Any], new: rollout.RolloutState, actor: str,
                    extra: dict[str, Any] | None = None) -> bool:
    """Store the release's new state; True when it changed what devices are served (stage, step or pause,
    announced to every replica), False when only counts moved."""
    values = {"stage": new.stage, "step": new.step, "paused": new.paused, "step_success": new.step_success,
              "step_failure": new.step_failure, "reason": new.reason, "updated_at": time.time(),
              "step_population": max(0, new.population), **(extra or {})}
    if (new.stage, new.step) != (row.stage, row.step) or any(e == "resume" for e in new.events):
        new = count_population(conn, row.task, row.version, row.targeting, rollout.RolloutPolicy.from_dict(row.policy),
                               new)
        values.update(stage=new.stage, step=new.step, step_population=new.population)
    if new.stage in ("beta", "gray", "completed"):
        values["exposed"] = True
    conn.execute(releases.update().where(releases.c.id == row.id).values(**values))
    changed = bool(new.events) or (new.stage, new.step, new.paused) != (row.stage, row.step, row.paused)
    if changed:
        announce(conn)
    for event in new.events:
        write_audit(conn, actor, event, row.id, new.reason if event.startswith(("rollback", "pause", "abort")) else "")
    return changed


def check_published_manifest(signed: dict[str, Any]) -> dict[str, Any]:
    """The shape of a release the server stores, beyond its signature: the config `task pack` would accept and
    well-formed file entries (manifest.validate_release_manifest, checked on a copy: the signed bytes stay as
    they were signed), so a release that would crash agents is refused at publish, not on every device."""
    validate_release_manifest(copy.deepcopy(signed))
    return signed


def publish(engine: sa.Engine, root: Root, store: BlobStore, envelope: dict[str, Any],
            rollback_envelope: dict[str, Any], policy_dict: dict[str, Any], actor: str) -> int:
    """Store a release after checking both signatures, the version order and that every file is uploaded."""
    signed = check_published_manifest(verify_release(root, envelope))
    rb = check_published_manifest(verify_release(root, rollback_envelope, task=signed["task"],
                                                 min_version=signed["version"] + 1))
    if rb.get("rollback_of") != signed["version"]:
        raise FleetError("rollback manifest does not name this release")
    missing = [f["sha256"] for f in signed["files"] + rb["files"] if not store.exists(f["sha256"])]
    if missing:
        raise FleetError(f"{len(missing)} file(s) not uploaded, first {missing[0]}")
    policy = rollout.RolloutPolicy.from_dict(policy_dict)
    targeting = validate_targeting(signed["config"].get("targeting", {}))
    state = rollout.initial_state(policy)
    now = time.time()
    try:
        with engine.begin() as conn:
            # Publishes of one task are serialised, so two at once cannot both pass the version check below.
            write_lock(conn, f"publish:{signed['task']}")
            # Versions are immutable and increase: a new version must exceed every version so far,
            # including the rollback version reserved by the latest release.
            top = conn.execute(sa.select(sa.func.max(releases.c.version)).where(releases.c.task == signed["task"])).scalar()
            if top is not None and signed["version"] <= top + 1:
                raise FleetError(f"{signed['task']} v{signed['version']} must be above v{top + 1} "
                                 f"(v{top} and its rollback version exist)")
            result = conn.execute(releases.insert().values(
                task=signed["task"], version=signed["version"], envelope=envelope, rollback_envelope=rollback_envelope,
                targeting=targeting, policy=policy.as_dict(), stage=state.stage, step=0, paused=False,
                exposed=state.stage != "simulation", step_success=0, step_failure=0, total_success=0,
                total_failure=0, reason="", sim_lease_until=0.0, created_at=now, updated_at=now))
            assert result.inserted_primary_key is not None
            release_id = int(result.inserted_primary_key[0])
            write_audit(conn, actor, "publish", release_id, f"{signed['task']} v{signed['version']} stage={state.stage}")
            counted = count_population(conn, signed["task"], signed["version"], targeting, policy, state)
            conn.execute(releases.update().where(releases.c.id == release_id).values(
                stage=counted.stage, step=counted.step, step_population=counted.population,
                exposed=counted.stage != "simulation"))
            for event in counted.events:
                write_audit(conn, actor, event, release_id)
            announce(conn)
    except sa.exc.IntegrityError as exc:  # serialised above, so only a foreign writer gets here
        raise FleetError(f"{signed['task']} v{signed['version']} is already stored") from exc
    return release_id


ACTIONS = {"pause": rollout.pause, "resume": rollout.resume, "abort": rollout.abort}


def control(engine: sa.Engine, release_id: int, action: str, actor: str) -> dict[str, Any]:
    """Pause, resume or abort; idempotent (a repeated action changes nothing and logs nothing)."""
    fn = ACTIONS.get(action)
    if fn is None:
        raise FleetError(f"unknown action {action!r}; choose one of {', '.join(ACTIONS)}")
    with engine.begin() as conn:
        row = lock_release(conn, release_id)
        new = fn(state_of(row))
        if new.events:
            save_transition(conn, row, new, actor)
    return describe(engine, release_id)


def apply_counts(conn: sa.Connection, release_id: int, success: int, failure: int) -> bool:
    """Add a report batch and evaluate against the step's stored population (the elected step monitor keeps it
    current, outside this row lock: step_monitor.py). True when the release's stage, step or pause changed
    (what check-ins are answered from); a batch that only adds to the counts changes nothing they serve."""
    row = lock_release(conn, release_id)
    policy = rollout.RolloutPolicy.from_dict(row.policy)
    state = state_of(row)
    new = rollout.apply_reports(state, policy, success, failure)
    totals = {"total_success": row.total_success + success, "total_failure": row.total_failure + failure}
    return save_transition(conn, row, new, "monitor", totals)


def describe_row(row: sa.Row[Any]) -> dict[str, Any]:
    policy = rollout.RolloutPolicy.from_dict(row.policy)
    state = state_of(row)
    total = row.total_success + row.total_failure
    return {"id": row.id, "task": row.task, "version": row.version, "stage": row.stage, "step": row.step,
            "paused": row.paused, "exposure_percent": rollout.exposure_percent(state, policy),
            "step_success": row.step_success, "step_failure": row.step_failure, "step_population": row.step_population,
            "total_success": row.total_success, "total_failure": row.total_failure,
            "failure_rate": (row.total_failure / total) if total else 0.0, "reason": row.reason,
            "targeting": row.targeting, "policy": row.policy, "created_at": row.created_at,
            "updated_at": row.updated_at}


def describe(engine: sa.Engine, release_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(sa.select(releases).where(releases.c.id == release_id)).first()
    if row is None:
        raise FleetError(f"no release #{release_id}")
    return describe_row(row)


def latest_good_manifest(engine: sa.Engine, task: str) -> dict[str, Any] | None:
    """The manifest a rollback of the next release should return to: what the fleet runs when it is stable."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(releases).where(releases.c.task == task)
                            .order_by(releases.c.version.desc())).all()
    for row in rows:
        if row.stage == "completed":
            return dict(row.envelope)
        if row.stage in rollout.TERMINAL and row.exposed:
            return dict(row.rollback_envelope)
    return None
