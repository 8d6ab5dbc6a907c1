"""The device agent: check in, pull and verify assigned task versions, activate them atomically, run them
in the compute container, and report every run.

Usable in-process (`Agent(...).step()` or `.run_forever()`) and as `edgerun fleet agent`. Other parts of
edgerun plug in through `TaskHooks`: the stream pipeline registers each active task's `triggers` and
calls the `run_fn` it was handed when a trigger matches.
"""

from __future__ import annotations

import itertools
import json
import logging
import platform
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

from edgerun.fleet.agent_state import AgentState, safe_text
from edgerun.fleet.container import Launch, Limits, RunResult, clear_scratch, run_in_container
from edgerun.fleet.device_id import check_device_id
from edgerun.fleet.device_state import DeviceState, read_device_state
from edgerun.fleet.errors import ExpiredError, FleetError, IntegrityError
from edgerun.fleet.freshness import verify_timestamp
from edgerun.fleet.installer import Installer
from edgerun.fleet.manifest import validate_release_manifest, verify_assignment, verify_release
from edgerun.fleet.push_client import PushListener
from edgerun.fleet.sandbox import detect_level, meets
from edgerun.fleet.signing import Root, check_expiry, verify_root_update
from edgerun.fleet.targeting import DeviceProfile
from edgerun.fleet.task_schema import validate_task_config
from edgerun.fleet.warm_pool import WARM_WORKER, WarmPool

RunFn = Callable[[Any], RunResult]
# The points of a run and of a report flush where the agent's durable state changes; `Agent.on_step` is
# called at each (tests kill the agent there, to show that every step survives a kill).
RUN_STEPS = ("run-begun", "run-verified", "run-ended", "run-recorded", "reports-posted", "reports-marked")
log = logging.getLogger(__name__)
# What a malformed or unexpected server answer raises while we read it; the round is logged and retried.
ANSWER_ERRORS = (httpx.HTTPError, FleetError, ValueError, KeyError, TypeError, AttributeError)


class TaskHooks(Protocol):
    """What the agent tells the rest of the device about task (de)activation; see docs/fleet.md. Hooks may
    also have `stop()`, which the agent calls as it stops: `poll` then finishes the work in hand and starts
    no more (StreamHooks leaves the unprocessed events queued for the next start)."""

    def on_task_activated(self, task_id: str, config: dict[str, Any], run_fn: RunFn) -> None: ...

    def on_task_deactivated(self, task_id: str) -> None: ...

    def poll(self) -> None: ...


class Agent:
    def __init__(self, server_url: str, device_id: str, state_dir: str | Path, *,
                 root_path: str | Path | None = None, enroll_token: str | None = None,
                 app_version: str = "1.0", os_name: str = platform.system().lower(),
                 device_groups: tuple[str, ...] = (), user_groups: tuple[str, ...] = (),
                 hooks: TaskHooks | None = None, checkin_interval_s: float = 5.0,
                 http_timeout_s: float = 30.0, warm_workers: bool = False, max_concurrent_runs: int = 4,
                 on_step: Callable[[str, str], None] | None = None,
                 device_state: Callable[[], DeviceState] = read_device_state) -> None:
        self.server_url = server_url.rstrip("/")
        self.device_id = check_device_id(device_id)
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.app_version, self.os_name = app_version, os_name
        self.device_groups, self.user_groups = tuple(device_groups), tuple(user_groups)
        self.hooks = hooks
        self.device_state = device_state  # idle and charging, read at every check-in (federated jobs sample by it)
        self.checkin_interval_s = checkin_interval_s
        self.errors: list[str] = []  # refusals and failures of the latest check-in, for operators and tests
        self.on_step = on_step
        self.state = AgentState(self.state_dir / "agent.db")
        self.installer = Installer(self.state_dir)
        # Crash recovery first: drop half-built folders, turn interrupted runs into failure reports, and
        # quarantine a version the agent died running twice in a row (no crash loop: agent_state.py).
        self.installer.recover()
        for task, version in self.state.recover_interrupted_runs():
            log.warning("agent %s: %s v%d quarantined: the agent stopped during its runs", device_id, task, version)
        clear_scratch(self.state_dir / "scratch")
        self.http = httpx.Client(base_url=self.server_url, timeout=http_timeout_s)
        self.root = self._load_root(root_path)
        self._token = self.state.get("token")
        self._enroll_token = enroll_token
        self._last_run: dict[str, float] = {}
        self._announced: set[tuple[str, int]] = set()
        self.isolation = detect_level()  # reported on every check-in as "isolation"
        self.failed_rounds = 0  # consecutive rounds whose check-in failed; the wait backs off with it
        self.push_listener: PushListener | None = None  # set while run_forever(push=True) runs
        # Pre-started isolated workers per active task version (warm_pool.py); None: every run starts cold.
        self.pool = WarmPool(self._launch_for, max_concurrency=max_concurrent_runs) if warm_workers else None
        # Runs in progress, by a key of their own: (task, version, cancel event). A newer assignment for the
        # task sets the event, and the run stops at once (outcome `cancelled`).
        self._in_flight: dict[int, tuple[str, int, threading.Event]] = {}
        self._run_keys = itertools.count()
        self._runs_lock = threading.Lock()
        # Scheduled runs started by run_forever on threads of their own, so the loop (check-in, reports,
        # push) never waits for a task; at most `max_concurrent_runs` at once, one per task.
        self._background: dict[str, threading.Thread] = {}
        self.max_concurrent_runs = max_concurrent_runs
        # The hooks' poll (the stream pipeline and the runs its triggers start), on a thread of its own under
        # run_forever for the same reason; one poll at a time.
        self._hooks_thread: threading.Thread | None = None
        # Set while the agent stops: no run starts any more (one that is starting as the stop cancels the
        # runs in flight would otherwise miss the cancellation and run its whole timeout).
        self._stopping = threading.Event()

    # ---- trust and identity -------------------------------------------------------------------------
    def _load_root(self, root_path: str | Path | None) -> Root:
        stored = self.state.get_json("root")
        if stored is not None:
            return Root(stored)
        if root_path is None:
            raise FleetError("the agent needs a trusted root document the first time (--root keys/root.json)")
        envelope = json.loads(Path(root_path).read_text())
        root = Root(envelope)
        root.verify_role(envelope, "root")
        self.state.put_json("root", envelope)
        return root

    def _update_root(self, latest: int) -> None:
        """Walk the root chain one version at a time; each must be signed by the one before."""
        while self.root.version < latest:
            r = self.http.get(f"/v1/roots/{self.root.version + 1}")
            r.raise_for_status()
            new = verify_root_update(self.root, _json_object(r))
            self._reset_floors_of_rotated_roles(self.root, new)
            self.root = new
            self.state.put_json("root", self.root.envelope)

    def _reset_floors_of_rotated_roles(self, old: Root, new: Root) -> None:
        """TUF resets version floors when a role's keys rotate: what the old key signed can no longer be
        verified, so its floors protect nothing, and a floor a stolen key pushed to 2^62 must not lock the
        device out of the honest metadata the new key signs."""
        def keyids(root: Root, role: str) -> list[str]:
            return sorted(root.signed["roles"][role]["keyids"])

        if keyids(old, "assignment") != keyids(new, "assignment"):
            self.state.put("assignment_serial", "0")
        if keyids(old, "release") != keyids(new, "release"):
            self.state.reset_seen()

    @property
    def token(self) -> str:
        if self._token is None:
            if not self._enroll_token:
                raise FleetError("the agent is not enrolled; pass an enrolment token "
                                 "(--enroll-token-file or $EDGERUN_ENROLL_TOKEN)")
            # The device chooses its token and keeps it before asking, so a retry after a lost answer is
            # recognised; the server never issues a token for an id that is already enrolled.
            proposed = self.state.get("proposed_token")
            if proposed is None:
                proposed = secrets.token_urlsafe(32)
                self.state.put("proposed_token", proposed)
            r = self.http.post("/v1/devices/register", json={
                "enroll_token": self._enroll_token, "profile": self.profile().as_dict(), "device_token": proposed})
            if r.status_code in (403, 409):
                raise FleetError(f"the server refused enrolment: {r.text[:300]}")
            r.raise_for_status()
            # The server's answer may not override the token this device chose and stored before asking.
            _json_object(r)
            self._token = proposed
            self.state.put("token", self._token)
        return self._token

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def profile(self) -> DeviceProfile:
        state = self.device_state()
        return DeviceProfile(self.device_id, self.app_version, self.os_name, self.device_groups,
                             self.user_groups, {t: v for t, (v, _) in self.installer.active().items()},
                             state.idle, state.charging)

    # ---- push: check-in or any business request ------------------------------------------------------
    def profile_headers(self) -> dict[str, str]:
        """Headers to add to any business request so the server can say whether this device is stale."""
        return {**self._auth(), "X-Edgerun-Profile": json.dumps(self.profile().as_dict())}

    def handle_push_header(self, value: str | None) -> bool:
        """Act on the X-Edgerun-Assignment header of a business response; True if something changed."""
        if not value or value == "up-to-date":
            return False
        if value != f"/v1/devices/{self.device_id}/assignment":
            # Only ever this device's assignment on its own server: an absolute URL would carry the bearer
            # token to whatever origin the header names.
            self.errors.append(f"push header ignored: {value[:200]!r} is not this device's assignment path")
            return False
        r = self.http.get(value, headers=self._auth())
        r.raise_for_status()
        return self.apply_assignment(r.json())

    def check_in(self) -> bool:
        """One push-then-pull round; returns True if some task version changed."""
        profile = self.profile()
        r = self.http.post(f"/v1/devices/{self.device_id}/checkin",
                           json={**profile.as_dict(), "isolation": self.isolation,
                                 # the highest serial accepted: a server may answer with a timestamp it signed before
                                 "serial": int(self.state.get("assignment_serial", "0") or 0)},
                           headers=self._auth())
        r.raise_for_status()
        body = _json_object(r)
        root_version = body.get("root_version", 0)
        if not isinstance(root_version, int) or isinstance(root_version, bool):
            raise FleetError(f"malformed check-in answer: root_version {str(root_version)[:40]!r}")
        if root_version > self.root.version:
            self._update_root(root_version)
        if body.get("status") == "up-to-date":
            self.accept_timestamp(body.get("timestamp"))
            log.debug("agent %s: check-in: up to date", self.device_id)
            return False
        if body.get("status") != "update" or not isinstance(body.get("assignment"), dict):
            raise FleetError(f"malformed check-in answer: status {str(body.get('status'))[:40]!r}")
        return self.apply_assignment(body["assignment"])

    def accept_timestamp(self, envelope: Any) -> dict[str, Any]:
        """Believe an "up to date" answer only with a fresh timestamp signed for this device (TUF's
        timestamp role): a replayed old answer is refused once it expires, or at once if a newer serial
        was seen."""
        signed = verify_timestamp(self.root, envelope, device_id=self.device_id,
                                  min_serial=int(self.state.get("assignment_serial", "0") or 0))
        self.state.raise_int("assignment_serial", int(signed["serial"]))
        return signed

    # ---- pull, verify, activate ------------------------------------------------------------------------
    def _fetch(self, digest: str, offset: int) -> Iterator[bytes]:
        headers = {**self._auth(), **({"Range": f"bytes={offset}-"} if offset else {})}
        with self.http.stream("GET", f"/v1/blobs/{digest}", headers=headers) as r:
            r.raise_for_status()
            skip = offset if (offset and r.status_code == 200) else 0  # server ignored the Range header
            for chunk in r.iter_bytes(1 << 16):
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                if chunk:
                    yield chunk

    def apply_assignment(self, envelope: dict[str, Any]) -> bool:
        self.errors = []
        signed = verify_assignment(self.root, envelope, device_id=self.device_id,
                                   min_serial=int(self.state.get("assignment_serial", "0") or 0))
        self.state.raise_int("assignment_serial", int(signed["serial"]))
        changed = False
        active = self.installer.active()
        for task, release_env in sorted(signed["tasks"].items()):
            try:
                changed |= self._install(task, release_env, active.get(task))
            except (FleetError, httpx.HTTPError, OSError, ValueError, KeyError, TypeError) as exc:
                # One bad task must not block the others; it is retried on the next check-in.
                self.errors.append(f"{task}: {exc}")
        return changed

    def _install(self, task: str, envelope: dict[str, Any], current: tuple[int, Path] | None) -> bool:
        manifest = verify_release(self.root, envelope, task=task, min_version=self.state.seen_version(task))
        version = int(manifest["version"])
        if current is not None and current[0] == version:
            return False
        self.cancel_runs(task, f"version {version} was assigned")
        try:  # signed, yet unusable here: refuse it and say so once, so the rollout can roll it back
            validate_release_manifest(manifest)
            minimum = None if manifest.get("removed") else manifest["config"].get("min_isolation")
            if not meets(self.isolation, minimum):
                raise FleetError(f"needs isolation {minimum}; this device runs at {self.isolation}")
        except FleetError as exc:
            self.state.report_refusal(task, version, f"refused: {exc}")
            log.warning("agent %s: refused %s v%d: %s", self.device_id, task, version, exc)
            raise
        # Recorded before download: a replay of anything older is refused from now on, even after a crash.
        self.state.raise_seen(task, version)
        if manifest.get("removed"):
            if current is None:
                return False  # nothing to remove here; the version is recorded as seen all the same
            self._deactivate(task)
            return True
        for f in manifest["files"]:
            self.installer.fetch_blob(f["sha256"], int(f["length"]), self._fetch)
        self.installer.build_version(manifest, envelope)
        self.installer.activate(task, version)
        log.info("agent %s: installed %s v%d%s", self.device_id, task, version,
                 f" (was v{current[0]})" if current is not None else "")
        self.installer.prune(task, keep={version})
        self._announce(task, version, manifest["config"])
        if self.pool is not None:
            self.pool.retire(lambda folder: folder.exists())  # the pruned version's workers go
        return True

    def _deactivate(self, task: str) -> None:
        self.cancel_runs(task, "the task was removed")
        self.installer.deactivate(task)
        log.info("agent %s: removed %s", self.device_id, task)
        if self.pool is not None:
            self.pool.retire(lambda folder: folder.parent.name != task)
        if self.hooks is not None:
            self.hooks.on_task_deactivated(task)

    def _announce(self, task: str, version: int, config: dict[str, Any]) -> None:
        self._announced.add((task, version))
        if self.pool is not None and meets(self.isolation, config.get("min_isolation")):
            self.pool.prestart(self.installer.version_dir(task, version), config["entry"],
                               Limits.from_config(config.get("limits", {})))
        if self.hooks is not None:
            self.hooks.on_task_activated(task, config, lambda inputs: self.run_task(task, inputs))

    def announce_active(self) -> None:
        """Tell the hooks about tasks that were already active when the agent started."""
        for task, (version, folder) in self.installer.active().items():
            if (task, version) not in self._announced:
                config = json.loads((folder / "release.json").read_text())["signed"]["config"]
                self._announce(task, version, config)

    # ---- running tasks and reporting ----------------------------------------------------------------
    def task_config(self, task: str) -> tuple[int, Path, dict[str, Any]]:
        active = self.installer.active()
        if task not in active:
            raise FleetError(f"task {task!r} is not active on {self.device_id}")
        version, folder = active[task]
        return version, folder, json.loads((folder / "release.json").read_text())["signed"]["config"]

    def cancel_runs(self, task: str, why: str) -> int:
        """Stop every run of `task` in progress (a newer assignment replaced or removed its version)."""
        with self._runs_lock:
            events = [e for t, _, e in self._in_flight.values() if t == task and not e.is_set()]
        for event in events:
            event.set()
        if events:
            log.info("agent %s: %s: %d run(s) cancelled: %s", self.device_id, task, len(events), why)
        return len(events)

    def run_task(self, task: str, inputs: Any = None) -> RunResult:
        """Run the active version of `task` in the compute container and queue its report."""
        version, folder, config = self.task_config(task)
        key, cancel = next(self._run_keys), threading.Event()
        with self._runs_lock:
            if self._stopping.is_set():
                return RunResult("cancelled", 0.0, error="not run: the agent is stopping")
            self._in_flight[key] = (task, version, cancel)
        try:
            return self._run_task(task, version, folder, config, inputs, cancel)
        finally:
            with self._runs_lock:
                del self._in_flight[key]

    def _run_task(self, task: str, version: int, folder: Path, config: dict[str, Any], inputs: Any,
                  cancel: threading.Event) -> RunResult:
        expired = self._expired_release(task, folder)
        if expired is not None:
            return expired
        reason = self.state.quarantined(task, version)
        if reason is not None:  # reported once when it was quarantined
            return RunResult("failure", 0.0, error=f"not run: quarantined: {reason}")
        run_id = self.state.begin_run(task, version)
        self._step("run-begun", task)
        try:
            # Before every run: the files are exactly the signed ones, and the config is one we can honour.
            self.installer.verify_version(folder)
            config = validate_task_config(dict(config))
            if not meets(self.isolation, config.get("min_isolation")):
                raise FleetError(f"needs isolation {config['min_isolation']}; this device runs at {self.isolation}")
        except IntegrityError as exc:
            self.installer.remove_version(task, version)  # rebuilt from re-verified blobs on the next check-in
            result = RunResult("crash", 0.0, error=f"not run: {exc}")
        except (FleetError, OSError, ValueError, KeyError, TypeError) as exc:
            result = RunResult("failure", 0.0, error=f"not run: {exc}")
        else:
            self._step("run-verified", task)
            if self.pool is not None:
                result = self.pool.run(folder, config["entry"], Limits.from_config(config["limits"]),
                                       inputs if inputs is not None else {}, cancel)
            else:
                result = self._run_cold(folder, config, inputs, cancel)
        self._step("run-ended", task)
        result.error = safe_text(result.error)
        try:
            self.state.finish_run(run_id, result.outcome, result.latency_ms, result.error)
        except Exception as exc:  # whatever the run did to our bookkeeping, it is the task's
            self._quarantine_after_bookkeeping(task, version, run_id, exc)
            result = RunResult("crash", result.latency_ms, error=f"quarantined: {type(exc).__name__} recording "
                                                                 "the run's result")
        self._step("run-recorded", task)
        why = f": {result.error.strip().splitlines()[-1][:200]}" if result.error.strip() else ""
        log.info("agent %s: ran %s v%d: %s in %.0f ms%s", self.device_id, task, version, result.outcome,
                 result.latency_ms, why)
        return result

    def _quarantine_after_bookkeeping(self, task: str, version: int, run_id: str, exc: Exception) -> None:
        """A run whose result the agent could not record: report it with a fixed text and never run that
        version again here. Should even this fail, the run stays 'running' and the next start reports it
        (and quarantines the version after a second time: agent_state.py)."""
        reason = f"the agent could not record a run's result ({type(exc).__name__})"
        log.error("agent %s: %s v%d quarantined: %s", self.device_id, task, version, reason)
        self.state.finish_run(run_id, "crash", 0.0, reason)
        self.state.quarantine(task, version, reason)

    def _step(self, name: str, task: str = "") -> None:
        if self.on_step is not None:
            self.on_step(name, task)

    def _container_options(self, folder: Path) -> dict[str, Any]:
        """How every run of this device is isolated, cold or warm: the same level, hidden state, shares.
        Hooks may name files shared read-only with the runs of one task (`shared_paths(task)`: collective
        storage and that task's own data folder)."""
        task = folder.parent.name  # a version folder is tasks/<task>/<version> (Installer.version_dir)
        shared_paths = getattr(self.hooks, "shared_paths", None)
        shares: list[str | Path] = shared_paths(task) if shared_paths is not None else []
        cache, cache_env = search_cache()
        config = json.loads((folder / "release.json").read_text())["signed"]["config"]
        return {"network": bool(config.get("network", False)), "level": self.isolation,
                "work_root": self.state_dir / "scratch", "hide": [self.state_dir],
                "readonly_shares": [*(Path(p) for p in shares), cache], "extra_env": cache_env}

    def _launch_for(self, folder: Path, entry: str, limits: Limits) -> Launch:
        return Launch.prepare(folder, entry, limits, worker_script=WARM_WORKER, **self._container_options(folder))

    def _run_cold(self, folder: Path, config: dict[str, Any], inputs: Any, cancel: threading.Event) -> RunResult:
        return run_in_container(folder, config["entry"], inputs if inputs is not None else {},
                                limits=Limits.from_config(config["limits"]), cancel=cancel,
                                **self._container_options(folder))

    def _expired_release(self, task: str, folder: Path) -> RunResult | None:
        """An active release past its signed expiry is not run any more (it is reported in `errors`)."""
        try:
            check_expiry(json.loads((folder / "release.json").read_text())["signed"], f"release of {task}")
        except ExpiredError as exc:
            self.errors.append(f"{task}: {exc}; not run")
            return RunResult("expired", 0.0, error=str(exc))
        return None

    def run_scheduled(self, now: float | None = None, *, wait: bool = True) -> int:
        """Run tasks whose config has `schedule: {"every_s": N}` and are due; returns runs started.

        With `wait` the runs go one after another on this thread. Without it each starts on a thread of its
        own and this returns at once (run_forever: the loop never waits for a task); a task whose previous
        run is still going, or a run beyond `max_concurrent_runs`, waits for a later round."""
        now = time.monotonic() if now is None else now
        self._background = {t: th for t, th in self._background.items() if th.is_alive()}
        started = 0
        # Least recently started first: with more due tasks than free run slots, the ones that waited go
        # next instead of the same few winning every round.
        for task in sorted(self.installer.active(), key=lambda t: self._last_run.get(t, -1e18)):
            schedule = self.task_config(task)[2].get("schedule")
            every = schedule.get("every_s") if isinstance(schedule, dict) else None
            if not isinstance(every, (int, float)) or now - self._last_run.get(task, -1e18) < float(every):
                continue  # no schedule, or not due (a malformed one was refused at install)
            if not wait and (task in self._background or len(self._background) >= self.max_concurrent_runs):
                continue
            self._last_run[task] = now
            if wait:
                self._scheduled_run(task)
            else:
                thread = threading.Thread(target=self._scheduled_run, args=(task,), name=f"run-{task}", daemon=True)
                self._background[task] = thread
                thread.start()
            started += 1
        return started

    def _scheduled_run(self, task: str) -> None:
        try:
            self.run_task(task, {"scheduled": True})
        except (FleetError, OSError, ValueError, KeyError, TypeError) as exc:  # one task never stops the rest
            self.errors.append(f"{task}: run: {type(exc).__name__}: {exc}"[:500])

    def flush_reports(self) -> int:
        sent = 0
        while batch := self.state.pending_reports():
            r = self.http.post(f"/v1/devices/{self.device_id}/reports", json={"reports": batch},
                               headers=self._auth())
            r.raise_for_status()
            self._step("reports-posted")
            self.state.mark_sent([b["id"] for b in batch])
            self._step("reports-marked")
            sent += len(batch)
        if sent:
            log.info("agent %s: sent %d report(s)", self.device_id, sent)
        return sent

    def step(self, check_in: bool = True, *, wait: bool = True) -> None:
        """One round of the agent loop; network errors are logged and retried next round. `wait=False`
        starts due scheduled runs in the background instead of running them here (`run_scheduled`)."""
        self.errors = []
        if check_in:
            try:
                self.check_in()
                self.failed_rounds = 0
            except ANSWER_ERRORS as exc:
                self.failed_rounds += 1
                self.errors.append(f"check-in: {type(exc).__name__}: {exc}"[:500])
                log.warning("agent %s: check-in failed (%d in a row): %s", self.device_id, self.failed_rounds, exc)
        # Reports before any run: what the last run (or the last start's crash) did reaches the server even
        # if the next run kills the agent again, so the rollout can count it and roll the release back.
        self._flush_logged()
        self.announce_active()
        self.run_scheduled(wait=wait)
        self.poll_hooks(wait=wait)
        self._flush_logged()

    def poll_hooks(self, *, wait: bool = True) -> None:
        """The hooks' step (the stream pipeline: trigger matches run their tasks through `run_task`, so a
        newer assignment cancels them like any run). With `wait` on this thread; without it on a thread of
        its own, at most one at a time, so a triggered task that hangs holds up neither check-ins nor
        reports; a round while the previous poll still runs skips it."""
        if self.hooks is None:
            return
        if wait:
            self._poll_logged(self.hooks)
            return
        if self._hooks_thread is not None and self._hooks_thread.is_alive():
            return
        self._hooks_thread = threading.Thread(target=self._poll_logged, args=(self.hooks,), name="hooks-poll",
                                              daemon=True)
        self._hooks_thread.start()

    def _poll_logged(self, hooks: TaskHooks) -> None:
        try:
            hooks.poll()
        except Exception as exc:  # the hooks' fault never stops the loop
            self.errors.append(f"hooks: {type(exc).__name__}: {exc}"[:500])
            log.exception("agent %s: hooks poll failed", self.device_id)

    def _flush_logged(self) -> None:
        try:
            self.flush_reports()
        except ANSWER_ERRORS as exc:
            self.errors.append(f"reports: {type(exc).__name__}: {exc}"[:500])

    def run_forever(self, stop: threading.Event | None = None, *, push: bool = False,
                    fallback_checkin_s: float = 300.0) -> None:
        """The agent loop. With `push`, the server's event stream (push_client.py) says when to check in,
        and a check-in without a nudge happens only every `fallback_checkin_s`; the loop still ticks every
        `checkin_interval_s` for scheduled runs, the hooks and reports. Without it, every tick checks in."""
        stop = stop or threading.Event()
        self._stopping.clear()
        wake = threading.Event()
        listener: PushListener | None = None
        last_checkin = -1e18
        try:
            while not stop.is_set():
                due = not push or wake.is_set() or self.failed_rounds > 0 or \
                    time.monotonic() - last_checkin >= fallback_checkin_s
                if due:
                    wake.clear()  # a nudge arriving during this round wakes the next one at once
                    last_checkin = time.monotonic()
                try:
                    self.step(check_in=due, wait=False)
                except Exception as exc:  # the loop outlives any fault of one round
                    self.failed_rounds += 1
                    self.errors.append(f"round: {type(exc).__name__}: {exc}"[:500])
                    log.exception("agent %s: round failed", self.device_id)
                if push and listener is None and self._token is not None:  # enrolled by the first check-in
                    listener = self.push_listener = PushListener(self.server_url, self.device_id, self._auth,
                                                                 wake).start()
                for e in self.errors:
                    print(safe_text(f"agent {self.device_id}: {e}"), flush=True)
                deadline = time.monotonic() + self.next_wait_s()
                while not stop.is_set() and not wake.is_set() and time.monotonic() < deadline:
                    wake.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        finally:
            if listener is not None:
                listener.stop()
            self._stop_background_runs()
            self._flush_logged()  # the runs just cancelled are reported now rather than at the next start

    def _stop_background_runs(self, grace_s: float = 10.0) -> None:
        """Cancel the runs in progress, start no more, and wait (bounded) for their reports to be written."""
        stop_hooks = getattr(self.hooks, "stop", None)
        if stop_hooks is not None:
            stop_hooks()  # the pipeline processes no further event (left queued for the next start)
        with self._runs_lock:
            self._stopping.set()
            events = [e for _, _, e in self._in_flight.values()]
        for event in events:
            event.set()
        for thread in [*self._background.values(), *([self._hooks_thread] if self._hooks_thread else [])]:
            thread.join(grace_s)

    def next_wait_s(self) -> float:
        """The check-in interval, doubled per consecutive failed round up to 64×, with jitter (no stampede)."""
        factor = 2.0 ** min(self.failed_rounds, 6)
        return self.checkin_interval_s * factor * (random.uniform(0.5, 1.0) if self.failed_rounds else 1.0)

    def close(self) -> None:
        self._stop_background_runs()
        if self.pool is not None:
            self.pool.close()
        self.http.close()
        self.state.close()


def search_cache() -> tuple[Path, dict[str, str]]:
    """The device's search cache (calibrations, tuned placements) and the environment that names it: a task
    that calls `edgerun.load(..., backends="auto")` reads it, read-only, instead of calibrating again."""
    from edgerun.search.fingerprint import CACHE_ENV, cache_dir

    cache = cache_dir().resolve()
    return cache, {CACHE_ENV: str(cache)}


def _json_object(r: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or a FleetError saying what came instead (an HTML page, bad JSON, a list)."""
    try:
        body = r.json()
    except ValueError as exc:
        kind = r.headers.get("content-type", "no content type")
        raise FleetError(f"malformed answer from {r.request.url.path} ({kind}): {r.text[:80]!r}") from exc
    if not isinstance(body, dict):
        raise FleetError(f"malformed answer from {r.request.url.path}: expected an object, got {type(body).__name__}")
    return body
