"""Helpers of the fleet tests: real servers on loopback (subprocesses on free ports), task packages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgerun.fleet.local_server import FleetServer, free_port, start_server, token_file
from edgerun.fleet.package import pack_task

REPO = Path(__file__).resolve().parents[2]
__all__ = ["REPO", "FleetServer", "free_port", "make_task", "start_server", "token_file"]


def make_task(base: Path, name: str, version: int, body: str = "def run(inputs):\n    return {'ok': True}\n",
              files: dict[str, bytes] | None = None, **config: Any) -> Path:
    """Write a task folder and pack it; returns the package path."""
    src = base / f"{name}-v{version}-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "task.json").write_text(json.dumps({"name": name, "version": version, "entry": "main.py", **config}))
    (src / "main.py").write_text(body)
    for rel, data in (files or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    pkg = base / f"{name}-v{version}.tar"
    pack_task(src, pkg)
    return pkg


FAILING_BODY = "def run(inputs):\n    raise RuntimeError('bad version')\n"
