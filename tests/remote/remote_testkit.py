"""Real device servers for the remote-runtime tests: `edgerun serve` in subprocesses on loopback."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    token: str

    @property
    def address(self) -> str:
        return self.url.removeprefix("tcp://")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
    token = secrets.token_hex(24)
    token_file = tmp / f"token-{secrets.token_hex(4)}"
    token_file.write_text(token)
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "serve", "--port", "0", "--token-file",
                             str(token_file), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return ServerProcess(proc, line.split("listening on ")[1].split()[0], token)
