"""The device side of the release server: enrolment, check-in (push), assignments, run reports.

Check-ins are the hot path. Releases are cached per process for `cache_ttl_s` (each local write drops
the cache at once), device tokens are cached after the first lookup, and last-seen/profile writes are
batched once a second, so an up-to-date check-in touches no database at all.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.errors import FleetError
from edgerun.fleet.manifest import sign_assignment
from edgerun.fleet.schema import devices, releases, reports, roots
from edgerun.fleet.signing import Root, SigningKey, verify_root_update
from edgerun.fleet.targeting import DeviceProfile, bucket_percent, matches, precedence

RECOUNT_S = 1.0


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class CachedRelease:
    id: int
    task: str
    version: int
    envelope: dict[str, Any]
    rollback_envelope: dict[str, Any]
    targeting: dict[str, Any]
    stage: str
    exposure: float
    exposed: bool
    beta: frozenset[str]

    def manifest_for(self, device_id: str) -> dict[str, Any] | None:
        """This release's answer for one device it targets, or None to fall through to older releases."""
        if self.stage in rollout.TERMINAL:
            return self.rollback_envelope if self.exposed else None
        if device_id in self.beta and self.stage != "simulation":
            return self.envelope
        if self.exposure > 0 and bucket_percent(device_id, f"{self.task}:{self.version}") < self.exposure:
            return self.envelope
        return None


class FleetService:
    def __init__(self, engine: sa.Engine, online_key: SigningKey, enroll_token: str,
                 cache_ttl_s: float = 0.2) -> None:
        self.engine = engine
        self.online_key = online_key
        self.enroll_token = enroll_token
        self.cache_ttl_s = cache_ttl_s
        self._lock = threading.Lock()
        self._releases: dict[str, list[CachedRelease]] = {}
        self._releases_at = 0.0
        self._tokens: dict[str, str] = {}
        self._seen: dict[str, tuple[dict[str, Any], float]] = {}
        self._root: Root | None = None
        self._serial = 0
        # Recounting a step's live population scans the device table, so a busy release recounts at most
        # once per RECOUNT_S in this process; the step monitor covers the quiet moments in between.
        self._recounted: dict[int, float] = {}

    # ---- trust root -------------------------------------------------------------------------------
    def root(self) -> Root:
        if self._root is None:
            with self.engine.connect() as conn:
                env = conn.execute(sa.select(roots.c.envelope).order_by(roots.c.version.desc()).limit(1)).scalar()
            if env is None:
                raise FleetError("the server has no root metadata")
            self._root = Root(env)
        return self._root

    def root_document(self, version: int) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(roots.c.envelope).where(roots.c.version == version)).scalar()

    def add_roots(self, chain: list[dict[str, Any]]) -> int:
        """Accept root documents in order; each new one must be signed by its predecessor's root keys."""
        with self.engine.begin() as conn:
            current_env = conn.execute(sa.select(roots.c.envelope).order_by(roots.c.version.desc()).limit(1)).scalar()
            current = Root(current_env) if current_env is not None else None
            for env in sorted(chain, key=lambda e: int(e["signed"]["version"])):
                if current is None:
                    current = Root(env)
                    current.verify_role(env, "root")
                elif int(env["signed"]["version"]) <= current.version:
                    continue
                else:
                    current = verify_root_update(current, env)
                conn.execute(roots.insert().values(version=current.version, envelope=env))
        self._root = None
        return self.root().version

    # ---- devices ----------------------------------------------------------------------------------
    def register(self, enroll_token: str, profile: DeviceProfile) -> str:
        if not hmac.compare_digest(enroll_token.encode(), self.enroll_token.encode()):
            raise PermissionError("bad enrolment token")
        token = secrets.token_urlsafe(32)
        now = time.time()
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(devices.c.id).where(devices.c.id == profile.device_id)).first()
            values = {"token_hash": token_hash(token), "profile": profile.as_dict(), "last_seen": now}
            if exists:
                # Re-enrolment (a wiped device) replaces the token; the old one stops working.
                conn.execute(devices.update().where(devices.c.id == profile.device_id).values(**values))
            else:
                conn.execute(devices.insert().values(id=profile.device_id,
                                                     registered_at=now, **values))
        with self._lock:
            self._tokens = {t: d for t, d in self._tokens.items() if d != profile.device_id}
        return token

    def device_for_token(self, token: str) -> str | None:
        h = token_hash(token)
        device = self._tokens.get(h)
        if device is None:
            with self.engine.connect() as conn:
                device = conn.execute(sa.select(devices.c.id).where(devices.c.token_hash == h)).scalar()
            if device is not None:
                with self._lock:
                    self._tokens[h] = device
        return device

    def note_seen(self, profile: DeviceProfile) -> None:
        with self._lock:
            self._seen[profile.device_id] = (profile.as_dict(), time.time())

    def flush_seen(self) -> int:
        with self._lock:
            batch, self._seen = self._seen, {}
        if batch:
            with self.engine.begin() as conn:
                conn.execute(devices.update().where(devices.c.id == sa.bindparam("b_id"))
                             .values(profile=sa.bindparam("b_profile"), last_seen=sa.bindparam("b_seen")),
                             [{"b_id": d, "b_profile": p, "b_seen": t} for d, (p, t) in batch.items()])
        return len(batch)

    # ---- what each device should run --------------------------------------------------------------
    def invalidate(self) -> None:
        self._releases_at = 0.0

    def _cached_releases(self) -> dict[str, list[CachedRelease]]:
        now = time.monotonic()
        if now - self._releases_at < self.cache_ttl_s:
            return self._releases
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(releases)).all()
        by_task: dict[str, list[CachedRelease]] = defaultdict(list)
        for r in rows:
            if r.stage in rollout.TERMINAL and not r.exposed:
                continue
            policy = rollout.RolloutPolicy.from_dict(r.policy)
            exposure = rollout.exposure_percent(rel.state_of(r), policy)
            by_task[r.task].append(CachedRelease(r.id, r.task, r.version, r.envelope, r.rollback_envelope,
                                                 r.targeting, r.stage, exposure, r.exposed,
                                                 frozenset(policy.beta_devices)))
        for cands in by_task.values():
            cands.sort(key=lambda c: (precedence(c.targeting), c.version), reverse=True)
        self._releases, self._releases_at = dict(by_task), now
        return self._releases

    def desired(self, profile: DeviceProfile) -> dict[str, dict[str, Any]]:
        """Per task, the release envelope this device should run (most specific targeting first)."""
        out: dict[str, dict[str, Any]] = {}
        for task, cands in self._cached_releases().items():
            for c in cands:
                if not matches(c.targeting, profile):
                    continue
                manifest = c.manifest_for(profile.device_id)
                if manifest is not None:
                    out[task] = manifest
                    break
        return out

    def needs_update(self, profile: DeviceProfile) -> dict[str, dict[str, Any]]:
        want = self.desired(profile)
        # A device never goes down a version, so one that is ahead counts as up to date; and a removal
        # concerns only devices that have the task.
        return {t: env for t, env in want.items() if int(env["signed"]["version"]) > profile.tasks.get(t, 0)
                and not (env["signed"].get("removed") and t not in profile.tasks)}

    def assignment(self, profile: DeviceProfile) -> dict[str, Any]:
        """The signed assignment; its serial is the server clock in microseconds, strictly increasing per
        process, so issuing one needs no database write. Server clocks must be synchronised (NTP): a device
        refuses a serial below the highest it has seen."""
        with self._lock:
            self._serial = max(self._serial + 1, time.time_ns() // 1000)
            serial = self._serial
        return sign_assignment(profile.device_id, serial, self.desired(profile), self.online_key)

    def stored_profile(self, device_id: str) -> DeviceProfile:
        pending = self._seen.get(device_id)
        if pending is not None:
            return DeviceProfile.from_dict(pending[0])
        with self.engine.connect() as conn:
            p = conn.execute(sa.select(devices.c.profile).where(devices.c.id == device_id)).scalar()
        if p is None:
            raise FleetError(f"unknown device {device_id!r}")
        return DeviceProfile.from_dict(p)

    # ---- run reports ------------------------------------------------------------------------------
    def _recount_due(self, release_id: int) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._recounted.get(release_id, -RECOUNT_S) < RECOUNT_S:
                return False
            self._recounted[release_id] = now
            return True

    def add_reports(self, device_id: str, items: list[dict[str, Any]]) -> int:
        return self.add_report_batches([(device_id, items)])[0]

    def add_report_batches(self, batches: list[tuple[str, list[dict[str, Any]]]]) -> list[int]:
        """Store reports of several devices in one transaction (a resent report id is ignored) and run the
        rollout monitor in that same transaction; returns how many reports of each batch were new."""
        now = time.time()
        counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        accepted = []
        with self.engine.begin() as conn:
            insert = (postgresql.insert(reports) if conn.dialect.name == "postgresql"
                      else sqlite.insert(reports))
            for device_id, items in batches:
                n = 0
                for item in items:
                    outcome = str(item["outcome"])
                    res = conn.execute(insert.values(
                        id=str(item["id"])[:64], device_id=device_id, task=str(item["task"]),
                        version=int(item["version"]), outcome=outcome, latency_ms=float(item.get("latency_ms", 0.0)),
                        error=str(item.get("error", ""))[:2000], received_at=now).on_conflict_do_nothing())
                    if res.rowcount:
                        n += 1
                        counts[(str(item["task"]), int(item["version"]))][0 if outcome == "success" else 1] += 1
                accepted.append(n)
            if counts:
                keys = list(counts)
                rows = conn.execute(sa.select(releases.c.id, releases.c.task, releases.c.version)
                                    .where(sa.tuple_(releases.c.task, releases.c.version).in_(keys))).all()
                for r in sorted(rows, key=lambda r: r.id):  # a fixed lock order: no deadlock between processes
                    ok, bad = counts[(r.task, r.version)]
                    rel.apply_counts(conn, r.id, ok, bad, recount=self._recount_due(r.id))
        if counts:
            self.invalidate()
        return accepted
