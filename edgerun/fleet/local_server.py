"""A real fleet server on loopback, in a subprocess on a free port, with its tokens in 0600 files: what the
fleet tests and `edgerun fleet demo` start (never a production deployment: it binds 127.0.0.1 only)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from edgerun.fleet.admin_client import AdminClient
from edgerun.fleet.agent import Agent
from edgerun.fleet.signing import KeyDir

# The folder holding the `edgerun` package: the server child imports this copy, not another one on its path.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FleetServer:
    url: str
    data: Path
    keys: KeyDir
    admin_token: str
    enroll_token: str
    proc: subprocess.Popen[bytes]
    log: Path
    agents: list[Agent] = field(default_factory=list)

    def admin(self) -> AdminClient:
        return AdminClient(self.url, self.admin_token)

    def agent(self, device_id: str, state: Path, **kw: Any) -> Agent:
        """An agent enrolled with the server's token, or, when it names device groups (which only the admin
        may vouch for), with a single-use token the admin minted for it carrying those groups."""
        token = kw.pop("enroll_token", self.enroll_token)
        if kw.get("device_groups"):
            admin = self.admin()
            token = admin.enrolment_token(device_id, tuple(kw["device_groups"]))
            admin.close()
        a = Agent(self.url, device_id, state, root_path=self.keys.latest_root_path(), enroll_token=token, **kw)
        self.agents.append(a)
        return a

    def wait_seen(self) -> None:
        """The server batches last-seen writes once a second; wait for one flush."""
        time.sleep(1.2)

    def stop(self) -> None:
        for a in self.agents:
            a.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def token_file(path: Path, token: str) -> Path:
    """A token file as the CLI accepts it: created mode 0600 (tokens never go on a command line)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def start_server(base: Path, keys: KeyDir, *extra: str, db_url: str = "", token_files: bool = True,
                 admin_token: str = "admin-secret", enroll_token: str = "enroll-secret") -> FleetServer:
    """The real server process; with `token_files=False` it generates its tokens into DATA/ itself."""
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    data = base / f"data-{port}"
    log = base / f"server-{port}.log"
    cmd = [sys.executable, "-m", "edgerun", "fleet", "serve", "--port", str(port), "--data", str(data),
           "--keys", str(keys.path), *extra]
    if token_files:
        cmd += ["--admin-token-file", str(token_file(base / f"admin-{port}", admin_token)),
                "--enroll-token-file", str(token_file(base / f"enroll-{port}", enroll_token))]
    if db_url:
        cmd += ["--db", db_url]
    env = {k: v for k, v in os.environ.items() if k not in ("EDGERUN_FLEET_TOKEN", "EDGERUN_ENROLL_TOKEN")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=PACKAGE_ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a start on a loaded machine (imports, migrations) can take tens of seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError(f"server did not start: {log.read_text()}")
    if not token_files:
        return FleetServer(url, data, keys, (data / "admin_token").read_text().strip(),
                           (data / "enroll_token").read_text().strip(), proc, log)
    return FleetServer(url, data, keys, admin_token, enroll_token, proc, log)
