"""A throwaway PostgreSQL cluster from Debian's packages, for tests, benchmarks and local trials.

Runs initdb and postgres as the `postgres` user when we are root (PostgreSQL refuses to run as root),
in a fresh folder, listening on loopback at a free port, with trust authentication.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from edgerun.fleet.errors import FleetError


def postgres_bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    def __init__(self) -> None:
        bindir = postgres_bin_dir()
        if bindir is None:
            raise FleetError("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt install postgresql)")
        self.bindir = bindir
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="edgerun-pg-", dir="/tmp"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, extra_conf: str = "") -> LocalPostgres:
        data = self.dir / "data"
        subprocess.run([*self._as_user, str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres",
                        "-A", "trust", "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
        conf = ("listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\nunix_socket_directories = '{self.dir}'\n"
                "fsync = on\nmax_connections = 200\nshared_buffers = 128MB\n" + extra_conf)
        with open(data / "postgresql.conf", "a") as f:
            f.write(conf)
        return self._launch()

    def _launch(self) -> LocalPostgres:
        data = self.dir / "data"
        self.proc = subprocess.Popen([*self._as_user, str(self.bindir / "postgres"), "-D", str(data)],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "log", "wb"))  # noqa: SIM115
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    time.sleep(0.2)
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        raise FleetError(f"PostgreSQL did not start: {(self.dir / 'log').read_text()[-2000:]}")

    def create_database(self, name: str) -> str:
        """A fresh, empty database in this cluster (one cluster can serve many servers, each on its own
        database); returns its URL."""
        import psycopg

        if not name.replace("_", "").isalnum():
            raise FleetError(f"database name {name!r}: letters, digits and '_' only")
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def shut_down(self) -> None:
        """Stop the server and keep the cluster (its data, its port) for `start_again`: a database restart."""
        self._halt()

    def start_again(self) -> LocalPostgres:
        return self._launch()

    def stop(self) -> None:
        self._halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _halt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # "fast" shutdown (a throwaway cluster need not wait for its clients), through pg_ctl: the signal
            # must reach postgres itself, not the `runuser` in front of it.
            subprocess.run([*self._as_user, str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "stop",
                            "-m", "fast", "-w"], capture_output=True, timeout=30)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
