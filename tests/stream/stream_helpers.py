"""A real cloud end for the stream tests: `python -m edgerun.stream.cloud_app` on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_file(path: Path, token: str) -> Path:
    """A token file as `edgerun fleet serve` and the cloud app accept it: created mode 0600 (tokens never go
    on a command line)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


class CloudServer:
    """The standalone cloud app in its own process; restartable on the same port and database."""

    def __init__(self, directory: Path, device_tokens: dict[str, str] | None = None,
                 admin_token: str | None = None) -> None:
        self.device_tokens, self.admin_token = device_tokens, admin_token
        self.extra_args: list[str] = []  # token files, never token values: argv shows in `ps`
        if device_tokens:
            lines = "\n".join(f"{device}={token}" for device, token in device_tokens.items())
            self.extra_args += ["--device-tokens-file", str(token_file(directory / "device-tokens", lines))]
        if admin_token:
            self.extra_args += ["--admin-token-file", str(token_file(directory / "admin-token", admin_token))]
        self.db_url = f"sqlite:///{directory / 'cloud.db'}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/stream"
        self.log = directory / "cloud.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> CloudServer:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgerun.stream.cloud_app", "--db", self.db_url, "--port", str(self.port),
                 *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        if wait:
            self.wait_ready()
        return self

    def start_forked(self, wait: bool = True) -> CloudServer:
        """The same server in a forked copy of this process: no interpreter start and imports, so the many
        restarts of the delivery test stay cheap. Still a separate process that SIGKILL really kills."""
        import uvicorn

        from edgerun.stream.cloud_app import create_app

        pid = os.fork()
        if pid == 0:
            try:
                fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                uvicorn.run(create_app(self.db_url, self.device_tokens, self.admin_token), host="127.0.0.1",
                            port=self.port, log_level="warning")
            finally:
                os._exit(1)
        self.proc = _ForkedProcess(pid)  # type: ignore[assignment]
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"cloud server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/stats", timeout=1.0).status_code in (200, 401, 403):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"cloud server not ready: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """kill -9: no chance to finish requests or close the database."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def records(self, token: str | None = None, **params: Any) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        response = httpx.get(f"{self.url}/records", params={"limit": 100_000, **params}, headers=headers,
                             timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    def stats(self) -> dict[str, int]:
        response = httpx.get(f"{self.url}/stats", timeout=10)
        response.raise_for_status()
        result: dict[str, int] = response.json()
        return result


class _ForkedProcess:
    """The part of Popen's interface CloudServer uses, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode
