"""What the compute container isolates with on this device, and the bubblewrap command line of one run.

Isolation levels, weakest first (`ISOLATION_LEVELS`); the agent reports its level on every check-in and
refuses a task whose signed config asks for more (`min_isolation`):

    rlimit-only   a plain process with rlimits (memory per process, CPU, files, file size, processes)
    cgroup        + one cgroup per run: total memory and process count of the whole tree, kill-all at the end
    bwrap+rlimit  bubblewrap namespaces: private mount view, own pid namespace (all die with the run),
                  no network, own ipc/uts; limits from rlimits only
    bwrap+cgroup  both

In every level, an agent running as root runs each task under a fresh unprivileged uid of its own; a
non-root agent gets bubblewrap's user namespace. The mount view holds only the interpreter, the task's own
files (read-only), a size-limited scratch tmpfs and /proc of its own pid namespace: never the agent's
state, keys, outbox or other tasks.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edgerun.fleet.errors import FleetError
from edgerun.fleet.sandbox_cgroup import cgroups_available
from edgerun.fleet.task_schema import ISOLATION_LEVELS

LEVEL_ENV = "EDGERUN_ISOLATION"  # caps the level (e.g. to test a weaker device); never raises it
UID_BASE = 1 << 30  # per-run uids are UID_BASE + 24 random bits: far above any login or app uid
TASK_MOUNT = "/task"
SCRATCH_MOUNT = "/tmp"
WORKER_MOUNT = "/.edgerun/worker.py"
# Files of /etc a Python program may need; only these are visible (name service and TLS when networked).
_ETC = ("ld.so.cache", "localtime", "hosts", "resolv.conf", "nsswitch.conf", "ssl", "ca-certificates")


@lru_cache(maxsize=1)
def _bwrap_path() -> str | None:
    """bubblewrap, if installed and able to make namespaces here (a container may forbid it)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                               capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if probe.returncode == 0 else None


def level_rank(level: str) -> int:
    if level not in ISOLATION_LEVELS:
        raise FleetError(f"unknown isolation level {level!r}; known: {', '.join(ISOLATION_LEVELS)}")
    return ISOLATION_LEVELS.index(level)


def detect_level() -> str:
    """The strongest level this device supports, capped by $EDGERUN_ISOLATION if set."""
    bwrap, cgroup = _bwrap_path() is not None, cgroups_available()
    best = ("bwrap+" if bwrap else "") + ("cgroup" if cgroup else ("rlimit" if bwrap else "rlimit-only"))
    cap = os.environ.get(LEVEL_ENV)
    if cap and level_rank(cap) < level_rank(best):
        return cap
    return best


def meets(level: str, minimum: str | None) -> bool:
    return minimum is None or level_rank(level) >= level_rank(minimum)


def run_uid() -> int | None:
    """A fresh unprivileged uid for one run when the agent is root; None otherwise (user namespaces)."""
    return UID_BASE + secrets.randbits(24) if os.geteuid() == 0 else None


@dataclass(frozen=True)
class MountPlan:
    """Where things are inside the sandbox."""

    task_dir: str
    worker: str
    scratch: str


def package_root() -> Path:
    """The folder holding the `edgerun` package the agent runs; tasks import the same one."""
    import edgerun

    return Path(edgerun.__file__).resolve().parents[1]


def _python_roots() -> list[Path]:
    """Folders the interpreter and its packages live in (read-only in the sandbox)."""
    # Resolved as well as named: a virtual environment reached through a link must be bound where the link
    # leads, or the interpreter is missing inside the sandbox.
    prefixes = (Path(sys.base_prefix), Path(sys.prefix))
    roots = {*prefixes, *(p.resolve() for p in prefixes), Path(sys.executable).resolve().parent}
    for entry in sys.path:
        if entry and Path(entry).exists():
            roots.add(Path(entry).resolve())
    roots.add(package_root())
    # Keep only the outermost folders, so no folder is bound twice.
    ordered = sorted(roots, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in ordered:
        if not any(p == k or k in p.parents for k in kept) and p != Path("/"):
            kept.append(p)
    return kept


def bwrap_command(task_dir: Path, worker: Path, *, scratch_mb: int, network: bool, hide: list[Path],
                  readonly_shares: list[Path], seccomp_fd: int | None = None) -> tuple[list[str], MountPlan]:
    """The bubblewrap prefix for one run; the caller appends the worker command (paths from the plan) and
    passes `seccomp_fd` (sandbox_seccomp.filter_fd) to the child."""
    bwrap = _bwrap_path()
    if bwrap is None:
        raise FleetError("bubblewrap is not usable on this device")
    # As root, no user namespace: the worker drops to the run's own uid itself (a user namespace made by
    # root would map the task to uid 0 outside). Otherwise bubblewrap's user namespace is the identity.
    if os.geteuid() == 0:
        args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    else:
        args = [bwrap, "--unshare-all"]
    if not network:
        args.append("--unshare-net")
    elif "--unshare-all" in args:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64"):
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    for name in _ETC:
        p = Path("/etc") / name
        if p.exists():
            args += ["--ro-bind", str(p), str(p)]
    # Scratch first: a bind below /tmp (a venv, a shared file) must land on top of it, not under it.
    args += ["--proc", "/proc", "--dev", "/dev",
             "--size", str(scratch_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", SCRATCH_MOUNT]
    roots = [r for r in _python_roots()
             if r.parts[1] not in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "etc", "proc", "dev")]
    shares = [share for share in readonly_shares if share.exists()]
    # Folders bubblewrap makes on the way to a mount point are 0700; the run's uid must pass through them.
    made: set[Path] = {Path("/"), Path(SCRATCH_MOUNT)}
    for target in roots + shares:
        for parent in reversed(target.parents):
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
    for target in roots:
        args += ["--ro-bind", str(target), str(target)]
    # The agent's state may lie under a bound folder (a source checkout): cover it with an empty tmpfs.
    for secret in hide:
        if any(secret == r or r in secret.parents for r in roots):
            args += ["--tmpfs", str(secret)]
    for target in shares:
        args += ["--ro-bind", str(target), str(target)]
    args += ["--ro-bind", str(task_dir), TASK_MOUNT,
             "--ro-bind", str(worker), WORKER_MOUNT,
             "--chdir", TASK_MOUNT]
    return args, MountPlan(TASK_MOUNT, WORKER_MOUNT, SCRATCH_MOUNT)
