"""A cgroup per task run: total memory and process count of the whole process tree, and kill-all at the end.

cgroup v2 (`memory.max`, `pids.max`, `cgroup.kill`) where this process's own cgroup lets us make children
with both controllers, else cgroup v1 (`memory.limit_in_bytes` under our own memory cgroup, `pids.max`
under our own pids cgroup), which is what many container hosts and Android kernels still mount. When
neither can be written, `RunCgroup.create` returns None and the container falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_MIB = 1024 * 1024


def _own_cgroups() -> dict[str, str]:
    """controller (or '' for the v2 hierarchy) → this process's path in that hierarchy."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _mounts() -> dict[str, Path]:
    """'v2' and each v1 controller ('memory', 'pids') → its mount point."""
    out: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            out.setdefault("v2", mount_point)
        elif fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in options:
                    out.setdefault(c, mount_point)
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass
class RunCgroup:
    """The cgroup folders of one run (one for v2; a memory and a pids folder for v1)."""

    version: int
    memory_dir: Path
    pids_dir: Path

    @classmethod
    def create(cls, memory_mb: int, processes: int) -> RunCgroup | None:
        """Make a fresh cgroup limited to `memory_mb` in total and `processes` tasks, or None if we cannot."""
        base = _bases()
        if base is None:
            return None
        version, memory_parent, pids_parent = base
        name = f"edgerun-run-{uuid.uuid4().hex[:12]}"
        memory_dir, pids_dir = memory_parent / name, pids_parent / name
        group = cls(version, memory_dir, pids_dir)
        try:
            for d in {memory_dir, pids_dir}:
                d.mkdir()
            limit = memory_mb * _MIB
            if version == 2:
                _write(memory_dir / "memory.max", str(limit))
                if (memory_dir / "memory.swap.max").exists():
                    _write(memory_dir / "memory.swap.max", "0")
            else:
                _write(memory_dir / "memory.limit_in_bytes", str(limit))
                if (memory_dir / "memory.memsw.limit_in_bytes").exists():
                    _write(memory_dir / "memory.memsw.limit_in_bytes", str(limit))
            _write(pids_dir / "pids.max", str(processes))
        except OSError:
            group.remove()
            return None
        return group

    def enter(self) -> None:
        """Move the calling process in (called in the child between fork and exec)."""
        for d in {self.memory_dir, self.pids_dir}:
            _write(d / "cgroup.procs", "0")

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in {self.memory_dir, self.pids_dir}:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill_all(self, wait_s: float = 5.0) -> int:
        """SIGKILL every process left in the cgroup (a detached child included); returns how many there were."""
        if self.version == 2 and (self.memory_dir / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.memory_dir / "cgroup.kill", "1")
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.005)
        return len(killed)

    def peak_memory_bytes(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.memory_dir / name).read_text())
        except (OSError, ValueError):
            return 0

    def oom_killed(self) -> bool:
        """True if the kernel's OOM killer killed a process of this run (the total memory limit was hit)."""
        try:
            if self.version == 2:
                for line in (self.memory_dir / "memory.events").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
                return False
            oom = (self.memory_dir / "memory.oom_control").read_text()
            return any(line.startswith("oom_kill ") and int(line.split()[1]) > 0 for line in oom.splitlines())
        except (OSError, ValueError):
            return False

    def remove(self) -> None:
        for d in {self.memory_dir, self.pids_dir}:
            for _ in range(50):  # a just-killed process may take a moment to leave
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


@lru_cache(maxsize=1)
def _bases() -> tuple[int, Path, Path] | None:
    """(version, memory parent, pids parent) where this process may make run cgroups; probed once."""
    try:
        own, mounts = _own_cgroups(), _mounts()
    except OSError:
        return None
    if "v2" in mounts and "" in own:
        parent = mounts["v2"] / own[""].lstrip("/")
        try:
            controllers = (parent / "cgroup.controllers").read_text().split()
            if {"memory", "pids"} <= set(controllers):
                subtree = (parent / "cgroup.subtree_control").read_text().split()
                if not {"memory", "pids"} <= set(subtree):
                    _write(parent / "cgroup.subtree_control", "+memory +pids")
                if _try_mkdir(parent):
                    return 2, parent, parent
        except OSError:
            pass
    if "memory" in mounts and "pids" in mounts and "memory" in own and "pids" in own:
        memory_parent = mounts["memory"] / own["memory"].lstrip("/")
        pids_parent = mounts["pids"] / own["pids"].lstrip("/")
        if _try_mkdir(memory_parent) and _try_mkdir(pids_parent):
            return 1, memory_parent, pids_parent
    return None


def _try_mkdir(parent: Path) -> bool:
    probe = parent / f"edgerun-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def cgroups_available() -> bool:
    return _bases() is not None


def sweep_stale(min_age_s: float = 60.0) -> int:
    """Remove run cgroups a killed agent left behind: only empty ones, and only older than `min_age_s`, so
    a run that has just made its cgroup and not yet entered it (another agent, another thread) keeps it."""
    base = _bases()
    if base is None:
        return 0
    removed = 0
    for parent in {base[1], base[2]}:
        for d in parent.glob("edgerun-run-*"):
            try:
                if time.time() - d.stat().st_mtime > min_age_s and not (d / "cgroup.procs").read_text().strip():
                    d.rmdir()
                    removed += 1
            except OSError:
                pass
    return removed
