"""`edgerun fleet agent` says what it does, one line each: an install, a run and its outcome, the reports
sent; --quiet keeps warnings only, --verbose adds each check-in."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import REPO, FleetServer, make_task, token_file

pytestmark = pytest.mark.xdist_group("fleet-agent")


def _agent_once(server: FleetServer, tmp_path: Path, device: str, *flags: str) -> subprocess.CompletedProcess[str]:
    enroll = token_file(tmp_path / f"enroll-{device}", server.enroll_token)
    return subprocess.run([sys.executable, "-m", "edgerun", "fleet", "agent", "--server", server.url, "--device-id",
                           device, "--state", str(tmp_path / device), "--root", str(server.keys.latest_root_path()),
                           "--enroll-token-file", str(enroll), "--once", "--no-stream", *flags],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=120)


def test_the_agent_logs_installs_runs_and_reports(shared_server: FleetServer, tmp_path: Path) -> None:
    devices = ["logs-default", "logs-quiet", "logs-verbose"]
    shared_server.admin().publish(
        make_task(tmp_path, "logged", 2, body="def run(inputs):\n    raise ValueError('said so')\n",
                  schedule={"every_s": 0}, targeting={"kind": "device", "values": devices}),
        shared_server.keys, {"steps": [100], "min_reports": 10**6, "error_min_reports": 10**6})
    default, quiet, verbose = (_agent_once(shared_server, tmp_path, d, *f) for d, f in
                               zip(devices, [(), ("--quiet",), ("--verbose",)]))
    lines = [line.split(" INFO ", 1)[1] for line in default.stderr.splitlines() if " INFO " in line]
    # The shared server may also hold other tests' releases for every device: this task's lines, in order.
    mine = [line for line in lines if " logged " in line]
    assert len(mine) == 2, default.stderr
    assert mine == ["agent logs-default: installed logged v2",
                    "agent logs-default: ran logged v2: failure in " + mine[1].split(" in ", 1)[1]], default.stderr
    assert mine[1].endswith("ms: ValueError: said so")
    assert re.fullmatch(r"agent logs-default: sent [1-9]\d* report\(s\)", lines[-1]), default.stderr
    assert quiet.returncode == default.returncode and " INFO " not in quiet.stderr
    assert "check-in" in verbose.stderr or "HTTP Request" in verbose.stderr
