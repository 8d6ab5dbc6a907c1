"""The device side of the release server: enrolment, check-in (push), assignments, run reports.

Check-ins are the hot path. Releases are cached per process for `cache_ttl_s` (each local write drops
the cache at once), device identities (token → id and admin-set groups) for `IDENTITY_TTL_S`, and
last-seen/profile writes are batched once a second, so an up-to-date check-in touches no database at all.

Trust (docs/fleet.md, "Enrolment, reports, freshness and bounded bodies"): an enrolment token creates a device id that does
not exist yet and never replaces an existing device's token; the device groups (the hardware class that
targeting relies on) come from the admin, never from a check-in; a run report counts towards a rollout only
if that device was assigned that release version, once per (device, run id).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from cachetools import LRUCache, TTLCache
from sqlalchemy.dialects import postgresql, sqlite

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.errors import FleetError
from edgerun.fleet.freshness import TIMESTAMP_LIFETIME_S, sign_timestamp
from edgerun.fleet.manifest import sign_assignment
from edgerun.fleet.refreshed import Refreshed
from edgerun.fleet.release_notify import announce_device
from edgerun.fleet.schema import deliveries, devices, enrolment_tokens, releases, reports, roots
from edgerun.fleet.server_tokens import SERVER_TOKEN_LABEL, admin_token_hash, token_hash
from edgerun.fleet.signing import Root, SigningKey, verify_root_update
from edgerun.fleet.targeting import DeviceProfile, device_bucket, in_step, matches, precedence, release_offset

log = logging.getLogger("edgerun.fleet.server")

ROOT_TTL_S = 5.0  # how soon a root accepted by another server process is noticed here
# How long another server process may keep using a revoked token or a device's old groups, where no
# notification tells it at once (SQLite); on PostgreSQL a revoke or a groups change is announced to every
# replica (release_notify.announce_device), and the cache only bounds memory and a lost notification.
IDENTITY_TTL_S = 10.0
NOTIFIED_IDENTITY_TTL_S = 600.0
# A stored last-seen time is at most this old while its device checks in (fewer row updates than check-ins);
# step populations count devices seen within a liveness window of a day by default.
SEEN_RESOLUTION_S = 300.0
DB_RETRY_S = 1.0  # while the database is away, how often the cached root and releases are looked up again


class EnrolmentError(FleetError):
    """An enrolment the server refuses; `status` is the HTTP answer (403 bad token, 409 id taken)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DeviceIdentity:
    device_id: str
    device_groups: tuple[str, ...]  # set by the admin, never by the device


@dataclass(frozen=True)
class ReleaseTable:
    """The releases any device may be offered, per task, most specific targeting first."""

    by_task: dict[str, list[CachedRelease]]
    shortest_window_s: float  # shortest liveness window of a running step (see `seen_resolution_s`)


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
    offset: int  # targeting.release_offset: where this release's gray window starts

    def manifest_for(self, device_id: str) -> dict[str, Any] | None:
        """This release's answer for one device it targets, or None to fall through to older releases."""
        if self.stage in rollout.TERMINAL:
            return self.rollback_envelope if self.exposed else None
        if device_id in self.beta and self.stage != "simulation":
            return self.envelope
        if self.exposure > 0 and in_step(device_bucket(device_id), self.offset, self.exposure):
            return self.envelope
        return None


class FleetService:
    def __init__(self, engine: sa.Engine, online_key: SigningKey,
                 cache_ttl_s: float = 0.2, timestamp_ttl_s: float = TIMESTAMP_LIFETIME_S,
                 online_key_loader: Callable[[], SigningKey] | None = None,
                 clock: Callable[[], float] = time.monotonic, identity_cache_size: int = 100_000,
                 identity_ttl_s: float = IDENTITY_TTL_S, seen_resolution_s: float = SEEN_RESOLUTION_S) -> None:
        self.engine = engine
        self.clock = clock  # monotonic seconds; the cache lifetimes are measured on it (tests pass their own)
        self._missing_key_logged = 0
        self.online_key = online_key
        self.online_key_loader = online_key_loader
        self.cache_ttl_s = cache_ttl_s
        self.timestamp_ttl_s = timestamp_ttl_s
        self._lock = threading.Lock()
        # Re-read each period (another replica may have changed them), never on the event loop (refreshed.py).
        self._release_table = Refreshed(self._read_releases, cache_ttl_s, clock, DB_RETRY_S)
        self._root = Refreshed(self._read_root, ROOT_TTL_S, clock, DB_RETRY_S)
        self._admin_hash = Refreshed(lambda _held: admin_token_hash(self.engine) or "", ROOT_TTL_S, clock, DB_RETRY_S)
        # token hash -> identity, for `identity_ttl_s`, at most `identity_cache_size` (least recently used out)
        self._tokens: TTLCache[str, DeviceIdentity] = TTLCache(identity_cache_size, identity_ttl_s, timer=clock)
        self._seen: dict[str, tuple[dict[str, Any], float]] = {}
        # device id -> (profile JSON text, last-seen time) this process last wrote for it (see `flush_seen`)
        self._written: LRUCache[str, tuple[str, float]] = LRUCache(identity_cache_size)
        self.seen_resolution = seen_resolution_s
        # device id -> (serial, root version, key id, envelope, envelope as JSON) of the last timestamp signed
        # for it, reused for half its lifetime (see `timestamp`)
        self._timestamps: TTLCache[str, tuple[int, int, str, dict[str, Any], bytes]] = TTLCache(
            identity_cache_size, timestamp_ttl_s / 2, timer=clock)
        self._serial = 0

    # ---- trust root -------------------------------------------------------------------------------
    def root(self) -> Root:
        """The newest root, re-read every ROOT_TTL_S (another server process may have accepted a rotation);
        at each re-read, a root naming an assignment key this process does not sign with makes it look in
        its key folder again (see `_follow_online_key`), so a rotation needs no restart, whichever comes first
        on a host: the new key file or the new root. For worker threads; the event loop uses `current`."""
        return self._root.get()

    def _read_root(self, held: Root | None) -> Root:
        with self.engine.connect() as conn:
            env = conn.execute(sa.select(roots.c.envelope).order_by(roots.c.version.desc()).limit(1)).scalar()
        if env is None:
            raise FleetError("the server has no root metadata")
        root = held if held is not None and int(env["signed"]["version"]) == held.version else Root(env)
        self._follow_online_key(root)
        return root

    def _follow_online_key(self, root: Root) -> None:
        """After `keys rotate --role assignment`, sign with the key the root names, read from the key folder;
        until it is there, devices refuse what this server signs, so say so in the log (once per root)."""
        named = root.signed["roles"]["assignment"]["keyids"]
        if self.online_key.keyid in named:
            return
        fresh = self.online_key_loader() if self.online_key_loader is not None else None
        if fresh is not None and fresh.keyid in named:
            self.online_key = fresh
            log.info("assignment key follows the root", extra={"root_version": root.version, "keyid": fresh.keyid})
        elif self._missing_key_logged != root.version:
            self._missing_key_logged = root.version
            log.warning("root names an assignment key this server does not hold; put it in the key folder's "
                        "assignment.key", extra={"root_version": root.version})

    def is_admin(self, token: str) -> bool:
        """The admin token, as stored in the database for every replica (server_tokens.py), re-read every
        ROOT_TTL_S, so a token replaced through another replica stops working here too. For worker threads."""
        return self._matches_admin(token, self._admin_hash.get())

    async def is_admin_async(self, token: str) -> bool:
        """`is_admin` for the event loop: the admin token's hash is never re-read on it (refreshed.py)."""
        return self._matches_admin(token, await self._admin_hash.get_async())

    @staticmethod
    def _matches_admin(token: str, admin_hash: str) -> bool:
        return bool(admin_hash) and hmac.compare_digest(token_hash(token), admin_hash)

    def root_document(self, version: int) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(roots.c.envelope).where(roots.c.version == version)).scalar()

    def add_roots(self, chain: list[dict[str, Any]]) -> int:
        """Accept root documents in order; each new one must be signed by its predecessor's root keys."""
        with self.engine.begin() as conn:
            # Replicas starting together on an empty database would otherwise all insert root v1.
            rel.write_lock(conn, "roots")
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
        self._root.invalidate()
        return self.root().version

    # ---- enrolment and device identity --------------------------------------------------------------
    def create_enrolment_token(self, *, device_id: str | None = None, device_groups: list[str] | None = None,
                               uses: int = 1, ttl_s: float = 86400.0, label: str = "admin") -> str:
        """A token minted by the admin: single-use by default, optionally scoped to one device id, and
        carrying the device groups (hardware class) the enrolled device gets."""
        if uses < 1 or not ttl_s > 0:
            raise FleetError("an enrolment token needs uses >= 1 and a positive lifetime")
        if label == SERVER_TOKEN_LABEL:
            raise FleetError(f"the label {SERVER_TOKEN_LABEL!r} is the server's own token")
        token = secrets.token_urlsafe(32)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(enrolment_tokens.insert().values(
                token_hash=token_hash(token), label=label[:64], device_id=device_id,
                device_groups=sorted(set(device_groups or ())), max_uses=uses, uses=0, expires_at=now + ttl_s,
                created_at=now))
        return token

    def register(self, enroll_token: str, profile: DeviceProfile, device_token: str) -> DeviceIdentity:
        """Enrol a new device id. The device proposes its own token (`device_token`), so a retry after a lost
        answer is recognised and answered again; the server never hands out a token for an existing id."""
        now = time.time()
        proposed = token_hash(device_token)
        with self.engine.begin() as conn:
            rel.write_lock(conn, "enrolment")
            existing = conn.execute(sa.select(devices.c.token_hash, devices.c.device_groups)
                                    .where(devices.c.id == profile.device_id)).first()
            if existing is not None:
                if hmac.compare_digest(existing.token_hash, proposed):
                    return DeviceIdentity(profile.device_id, tuple(existing.device_groups))
                raise EnrolmentError(409, f"device {profile.device_id!r} is already enrolled; an admin must revoke "
                                          f"it before it can enrol again")
            row = conn.execute(sa.select(enrolment_tokens)
                               .where(enrolment_tokens.c.token_hash == token_hash(enroll_token))).first()
            if row is None:
                raise EnrolmentError(403, "bad enrolment token")
            if row.expires_at is not None and row.expires_at <= now:
                raise EnrolmentError(403, "this enrolment token has expired")
            if row.max_uses is not None and row.uses >= row.max_uses:
                raise EnrolmentError(403, "this enrolment token has been used")
            if row.device_id is not None and row.device_id != profile.device_id:
                raise EnrolmentError(403, "this enrolment token is for another device id")
            conn.execute(enrolment_tokens.update().where(enrolment_tokens.c.token_hash == row.token_hash)
                         .values(uses=enrolment_tokens.c.uses + 1))
            identity = DeviceIdentity(profile.device_id, tuple(row.device_groups))
            if conn.execute(sa.select(devices.c.id).where(devices.c.token_hash == proposed)).first() is not None:
                raise EnrolmentError(409, "choose another device token")
            conn.execute(devices.insert().values(id=profile.device_id, token_hash=proposed,
                                                 profile=self.trusted_profile(profile, identity).as_dict(),
                                                 device_groups=list(identity.device_groups),
                                                 bucket=device_bucket(profile.device_id),
                                                 registered_at=now, last_seen=now))
        return identity

    def register_with_server_token(self, enroll_token: str, profile: DeviceProfile) -> tuple[str, DeviceIdentity]:
        """Enrolment for a client that does not choose its own token: the server makes one (no retry after a
        lost answer: the id then needs an admin's revoke)."""
        token = secrets.token_urlsafe(32)
        return token, self.register(enroll_token, profile, token)

    def set_device_groups(self, device_id: str, groups: list[str]) -> list[str]:
        groups = sorted(set(groups))
        with self.engine.begin() as conn:
            profile = conn.execute(sa.select(devices.c.profile).where(devices.c.id == device_id)).scalar()
            if profile is None:
                raise FleetError(f"unknown device {device_id!r}")
            conn.execute(devices.update().where(devices.c.id == device_id)
                         .values(device_groups=groups, profile={**profile, "device_groups": groups}))
            announce_device(conn, device_id)
        self._forget(device_id)
        return groups

    def revoke_device(self, device_id: str) -> bool:
        """Remove a device's enrolment (its reports stay): its token stops working and the id may enrol again."""
        with self.engine.begin() as conn:
            gone = conn.execute(devices.delete().where(devices.c.id == device_id)).rowcount
            conn.execute(deliveries.delete().where(deliveries.c.device_id == device_id))
            announce_device(conn, device_id)
        self._forget(device_id)
        return bool(gone)

    def forget(self, device_id: str) -> None:
        """Drop what this process cached of a device (another replica revoked it or changed its groups)."""
        self._forget(device_id)

    def _forget(self, device_id: str) -> None:
        with self._lock:
            for h in [h for h, i in self._tokens.items() if i.device_id == device_id]:
                self._tokens.pop(h, None)
            self._seen.pop(device_id, None)
            self._written.pop(device_id, None)
            self._timestamps.pop(device_id, None)

    def cached_identity(self, token: str) -> DeviceIdentity | None:
        """The identity of a token this process holds, without touching the database (None: not held)."""
        with self._lock:
            return self._tokens.get(token_hash(token))

    def identity(self, token: str) -> DeviceIdentity | None:
        """The device a token belongs to: held, or looked up in the database (a blocking round trip; the
        server runs this in its thread pool, see server.identity_of)."""
        h = token_hash(token)
        with self._lock:
            cached = self._tokens.get(h)
        if cached is not None:
            return cached
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(devices.c.id, devices.c.device_groups).where(devices.c.token_hash == h)).first()
        if row is None:
            return None
        found = DeviceIdentity(row.id, tuple(row.device_groups))
        with self._lock:
            self._tokens[h] = found
        return found

    def device_for_token(self, token: str) -> str | None:
        found = self.identity(token)
        return found.device_id if found is not None else None

    @staticmethod
    def trusted_profile(profile: DeviceProfile, identity: DeviceIdentity) -> DeviceProfile:
        """The device's profile with what targeting must not take from its word replaced by the admin's."""
        return replace(profile, device_groups=identity.device_groups)

    def note_seen(self, profile: DeviceProfile, at: float | None = None) -> None:
        """A check-in: kept until the next `flush_seen` (`at`: its wall-clock time, now unless a test says)."""
        with self._lock:
            self._seen[profile.device_id] = (profile.as_dict(), time.time() if at is None else at)

    def seen_resolution_s(self) -> float:
        """How stale a stored last-seen time may be: `seen_resolution_s`, or a quarter of the shortest liveness
        window of a running step, so no step ever counts a device that keeps checking in as gone."""
        return min(self.seen_resolution, self._release_table.get().shortest_window_s / 4)

    def flush_seen(self) -> int:
        """Write the check-ins noted since the last flush; returns how many devices it wrote. A device is written
        when its profile differs from what this process last wrote for it (an install, a new app version) or
        its stored last-seen time is `seen_resolution_s` old; the check-ins between write nothing, so the
        database takes one row update per device per resolution, not one per check-in."""
        with self._lock:
            batch, self._seen = self._seen, {}
        if not batch:
            return 0
        resolution = self.seen_resolution_s()
        rows = []
        for device_id, (profile, seen) in batch.items():
            text = json.dumps(profile)
            written = self._written.get(device_id)
            if written is None or written[0] != text or seen - written[1] >= resolution:
                rows.append((device_id, seen, text, profile))
        if not rows:
            return 0
        try:
            self._write_seen(rows)
        except Exception:
            # The database away (a restart): keep what was not written for the next flush, unless a newer
            # check-in of the same device came in meanwhile.
            with self._lock:
                for device_id, seen, _, profile in rows:
                    self._seen.setdefault(device_id, (profile, seen))
            raise
        with self._lock:
            for device_id, seen, text, _ in rows:
                self._written[device_id] = (text, seen)
        return len(rows)

    def _write_seen(self, rows: list[tuple[str, float, str, dict[str, Any]]]) -> None:
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # One statement for the whole batch; the profile is replaced only where its stored JSON text
                # differs (compared in the database: another replica may have written it since), and a last-seen
                # time never goes back (another replica may have written a later one).
                conn.execute(sa.text(
                    "UPDATE devices AS d SET last_seen = GREATEST(d.last_seen, v.seen), "
                    "profile = CASE WHEN d.profile::text = v.ptext THEN d.profile ELSE v.ptext::json END "
                    "FROM unnest(CAST(:ids AS text[]), CAST(:seens AS float8[]), CAST(:texts AS text[])) "
                    "AS v(id, seen, ptext) WHERE d.id = v.id"),
                    {"ids": [r[0] for r in rows], "seens": [r[1] for r in rows], "texts": [r[2] for r in rows]})
            else:
                unchanged = sa.cast(devices.c.profile, sa.Text) == sa.bindparam("b_text")
                conn.execute(devices.update().where(devices.c.id == sa.bindparam("b_id"))
                             .values(last_seen=sa.case((devices.c.last_seen > sa.bindparam("b_seen"), devices.c.last_seen),
                                                       else_=sa.bindparam("b_seen")),
                                     profile=sa.case((unchanged, devices.c.profile),
                                                     else_=sa.bindparam("b_profile", type_=devices.c.profile.type))),
                             [{"b_id": d, "b_seen": t, "b_profile": p, "b_text": text} for d, t, text, p in rows])

    # ---- what each device should run --------------------------------------------------------------
    def invalidate(self) -> None:
        """A release changed (here, or NOTIFY says elsewhere): the next reader waits for the table's re-read."""
        self._release_table.invalidate()

    def _cached_releases(self) -> dict[str, list[CachedRelease]]:
        """The release table, re-read every `cache_ttl_s`, for worker threads (the event loop uses `current`)."""
        return self._release_table.get().by_task

    async def current(self) -> tuple[Root, dict[str, list[CachedRelease]]]:
        """The root and the release table for the event loop, neither ever read from the database on it
        (refreshed.py): what `needs_update` and `timestamp` take from a request served there."""
        return await self._root.get_async(), (await self._release_table.get_async()).by_task

    def _read_releases(self, _held: ReleaseTable | None) -> ReleaseTable:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(releases)).all()
        by_task: dict[str, list[CachedRelease]] = defaultdict(list)
        shortest = float("inf")
        for r in rows:
            if r.stage in ("beta", "gray"):
                shortest = min(shortest, float(r.policy.get("active_window_s", rollout.RolloutPolicy.active_window_s)))
            if r.stage in rollout.TERMINAL and not r.exposed:
                continue
            policy = rollout.RolloutPolicy.from_dict(r.policy)
            exposure = rollout.exposure_percent(rel.state_of(r), policy)
            by_task[r.task].append(CachedRelease(r.id, r.task, r.version, r.envelope, r.rollback_envelope,
                                                 r.targeting, r.stage, exposure, r.exposed,
                                                 frozenset(policy.beta_devices), release_offset(r.task, r.version)))
        for cands in by_task.values():
            cands.sort(key=lambda c: (precedence(c.targeting), c.version), reverse=True)
        return ReleaseTable(dict(by_task), shortest)

    def desired(self, profile: DeviceProfile,
                table: dict[str, list[CachedRelease]] | None = None) -> dict[str, dict[str, Any]]:
        """Per task, the release envelope this device should run (most specific targeting first), from `table`
        (`current`'s, on the event loop) or the table held."""
        out: dict[str, dict[str, Any]] = {}
        for task, cands in (self._cached_releases() if table is None else table).items():
            for c in cands:
                if not matches(c.targeting, profile):
                    continue
                manifest = c.manifest_for(profile.device_id)
                if manifest is not None:
                    out[task] = manifest
                    break
        return out

    def needs_update(self, profile: DeviceProfile,
                     table: dict[str, list[CachedRelease]] | None = None) -> dict[str, dict[str, Any]]:
        want = self.desired(profile, table)
        # A device never goes down a version, so one that is ahead counts as up to date; and a removal
        # concerns only devices that have the task.
        return {t: env for t, env in want.items() if int(env["signed"]["version"]) > profile.tasks.get(t, 0)
                and not (env["signed"].get("removed") and t not in profile.tasks)}

    def _next_serial(self) -> int:
        """The server clock in microseconds, strictly increasing per process, so a serial needs no database
        write. Server clocks must be synchronised (NTP): a device refuses a serial below the highest it has
        seen, from assignments and timestamps alike."""
        with self._lock:
            self._serial = max(self._serial + 1, time.time_ns() // 1000)
            return self._serial

    def timestamp(self, device_id: str, seen_serial: int = 0, root: Root | None = None) -> dict[str, Any]:
        """The signed, short-lived proof that an "up to date" answer is current (TUF's timestamp role).

        Signing is a third of an up-to-date answer's CPU, so one signed timestamp answers a device again
        while it has more than half its lifetime left, under the same root and key, and only if its serial is
        not below `seen_serial`, the highest the device says it has accepted (from any replica: an assignment
        or a timestamp signed since makes this one stale, and the device would refuse it). A device that says
        nothing (0, an agent from before the field) always gets a fresh one. The freeze-attack bound is the
        same: a reused timestamp still expires `timestamp_ttl_s` after it was signed. `root`: the current one
        (`current`'s, on the event loop)."""
        return self._timestamp(device_id, seen_serial, root)[3]

    def timestamp_json(self, device_id: str, seen_serial: int = 0, root: Root | None = None) -> bytes:
        """`timestamp` as the JSON an answer carries, encoded once per signature (the hot path reuses it)."""
        return self._timestamp(device_id, seen_serial, root)[4]

    def _timestamp(self, device_id: str, seen_serial: int,
                   root: Root | None) -> tuple[int, int, str, dict[str, Any], bytes]:
        root, key = root or self.root(), self.online_key
        with self._lock:
            cached = self._timestamps.get(device_id)
        if (cached is not None and seen_serial > 0 and cached[0] >= seen_serial and cached[1] == root.version
                and cached[2] == key.keyid):
            return cached
        serial = self._next_serial()
        envelope = sign_timestamp(device_id, serial, root.version, key, self.timestamp_ttl_s)
        signed = (serial, root.version, key.keyid, envelope, json.dumps(envelope).encode())
        with self._lock:
            self._timestamps[device_id] = signed
        return signed

    def assignment(self, profile: DeviceProfile,
                   table: dict[str, list[CachedRelease]] | None = None) -> dict[str, Any]:
        """The signed assignment. Each release version in it is recorded as delivered to this device first:
        only the reports of devices a version was delivered to count towards its rollout. `table`: the
        release table the check-in was judged from (`current`), so that the answer is built from the same
        table without a second look (or re-read) in the worker thread; the table held when None."""
        tasks = self.desired(profile, table)
        if tasks:
            now = time.time()
            rows = [{"device_id": profile.device_id, "task": t, "version": int(env["signed"]["version"]),
                     "issued_at": now} for t, env in tasks.items()]
            with self.engine.begin() as conn:
                insert = postgresql.insert(deliveries) if conn.dialect.name == "postgresql" else sqlite.insert(deliveries)
                conn.execute(insert.on_conflict_do_nothing(), rows)
        return sign_assignment(profile.device_id, self._next_serial(), tasks, self.online_key)

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
    def add_reports(self, device_id: str, items: list[dict[str, Any]]) -> int:
        return self.add_report_batches([(device_id, items)])[0]

    def add_report_batches(self, batches: list[tuple[str, list[dict[str, Any]]]]) -> list[int]:
        """Store reports of several devices in one transaction and run the rollout monitor in that same
        transaction; returns how many reports of each batch were new. Items were validated by the API
        (`ReportItem`). A resent (device, run id) is ignored; a report of a version that was never delivered
        to its device, or of a run the agent cancelled, is kept for the record but never counted."""
        now = time.time()
        counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        accepted = []
        with self.engine.begin() as conn:
            insert = (postgresql.insert(reports) if conn.dialect.name == "postgresql"
                      else sqlite.insert(reports))
            delivered = self._delivered(conn, batches)
            # The first of each (device, run id) in the group is offered once; the database says which offers
            # were new through RETURNING (a rowcount is no answer: psycopg 3 gives -1 for ON CONFLICT DO NOTHING).
            first: dict[tuple[str, str], dict[str, Any]] = {}
            for device_id, items in batches:
                for item in items:
                    key = (str(item["task"]), int(item["version"]))
                    first.setdefault((device_id, str(item["id"])), {
                        "id": str(item["id"]), "device_id": device_id, "task": key[0], "version": key[1],
                        "outcome": str(item["outcome"]), "latency_ms": float(item.get("latency_ms", 0.0)),
                        "error": str(item.get("error", ""))[:2000], "received_at": now,
                        "counted": (device_id, *key) in delivered})
            new: set[tuple[str, str]] = set()
            if first:
                stored = conn.execute(insert.on_conflict_do_nothing().returning(reports.c.device_id, reports.c.id),
                                      list(first.values()))
                new = {(r.device_id, r.id) for r in stored}
            for device_id, items in batches:
                n = 0
                for item in items:
                    row = first.get((device_id, str(item["id"])))
                    if row is None or (device_id, row["id"]) not in new:
                        continue
                    new.discard((device_id, row["id"]))  # a repeat later in the group is not new again
                    n += 1
                    # A run the agent cancelled (a newer assignment, an abort, the agent stopping) says nothing
                    # about the version: counting it a failure let devices restarting roll a good release back.
                    if row["counted"] and row["outcome"] != "cancelled":
                        counts[(row["task"], row["version"])][0 if row["outcome"] == "success" else 1] += 1
                accepted.append(n)
            moved = False
            if counts:
                keys = list(counts)
                rows = conn.execute(sa.select(releases.c.id, releases.c.task, releases.c.version)
                                    .where(sa.tuple_(releases.c.task, releases.c.version).in_(keys))).all()
                for r in sorted(rows, key=lambda r: r.id):  # a fixed lock order: no deadlock between processes
                    ok, bad = counts[(r.task, r.version)]
                    moved = rel.apply_counts(conn, r.id, ok, bad) or moved
        # Only a stage, step or pause change touches the release table check-ins are answered from. Re-reading
        # it after every report commit made each check-in behind the commit wait for the whole table, and each
        # assignment re-read it in its own thread: during a step's installs, one re-read per report batch.
        if moved:
            self.invalidate()
        return accepted

    @staticmethod
    def _delivered(conn: sa.Connection, batches: list[tuple[str, list[dict[str, Any]]]]) -> set[tuple[str, str, int]]:
        """Which (device, task, version) of these batches were delivered to their device."""
        wanted = {(d, str(i["task"]), int(i["version"])) for d, items in batches for i in items}
        if not wanted:
            return set()
        rows = conn.execute(sa.select(deliveries.c.device_id, deliveries.c.task, deliveries.c.version)
                            .where(deliveries.c.device_id.in_({w[0] for w in wanted}),
                                   deliveries.c.task.in_({w[1] for w in wanted}))).all()
        return {(r.device_id, r.task, r.version) for r in rows} & wanted
