"""nginx in front of server replicas: the configuration docs/fleet.md gives operators, and a throwaway nginx
(Debian's package) built from it for the tests and the benchmark.

What the balancer is for, beyond spreading requests: it reads every request's headers and body itself, with
timeouts (`client_header_timeout`, `client_body_timeout`), before a replica sees a byte, so a client that
sends half a request and waits (thousands of them, cheaply) ties up an nginx connection slot until the
timeout, not a server's worker. A device's own routes (`DEVICE_ROUTES`) go to one replica per device (a
consistent hash of its token), so the identity and timestamp a replica caches serve that device's next
check-ins; round robin made two in three check-ins of three replicas miss them. Everything else (the admin
API, the stream's collection reads, enrolment, readiness) goes to the least busy replica: hashed too, an
admin's requests, all carrying one token, would all land on one replica. Push streams are passed through
unbuffered with a long read timeout; a replica that fails is skipped for the next try
(`proxy_next_upstream`), and `/metrics` answers only the monitoring network.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from edgerun.fleet.errors import FleetError

NGINX = "/usr/sbin/nginx"
# nginx locations of the requests a device makes with its own token: check-ins, reports, assignments, blob
# downloads and the stream tunnel's batches (the push stream, `/v1/devices/{id}/events`, has its own location).
DEVICE_ROUTES = ("/v1/devices/", "/v1/blobs/", "= /v1/stream/batches")


def nginx_config(replicas: list[str], listen: str, *, header_timeout_s: int = 10, body_timeout_s: int = 10,
                 prefix: str = "/var/lib/edgerun-nginx", metrics_from: str = "127.0.0.1",
                 max_body_mb: int = 1100) -> str:
    """The nginx.conf of a balancer listening on `listen` (host:port) in front of `replicas` (host:port each)."""
    servers = "\n".join(f"        server {r} max_fails=1 fail_timeout=5s;" for r in replicas)
    device_locations = "\n".join(f"        location {route} {{ proxy_pass http://fleet_devices; }}"
                                  for route in DEVICE_ROUTES)
    return f"""worker_processes auto;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
# Per worker; a push stream takes two (the device's, the replica's), within the worker's open-file limit.
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    # A request's headers must all arrive within this, and a body may pause at most this long between reads:
    # a client holding half-sent requests open is cut off here, never reaching a replica.
    client_header_timeout {header_timeout_s}s;
    client_body_timeout {body_timeout_s}s;
    send_timeout 30s;
    keepalive_timeout 75s;
    client_max_body_size {max_body_mb}m;   # admin file uploads (`fleet serve --max-blob-mb`)
    # Affinity: a device's requests all carry its token, so hashing on it sends each device to one replica,
    # whose caches then hold that device's identity and signed timestamp. A request without a token
    # (enrolment) hashes on its own random id: any replica.
    map $http_authorization $fleet_affinity {{
        ""      $request_id;
        default $http_authorization;
    }}
    upstream fleet_devices {{
        hash $fleet_affinity consistent;   # a replica's failure moves only its own devices, to the next one
{servers}
        keepalive 64;                  # shared keep-alive connections to the replicas (after `hash`)
        # Closed by nginx before a replica would close them (uvicorn: 5 s idle): a request sent on a connection
        # the replica is closing gets a reset, and marks the replica failed for `fail_timeout`.
        keepalive_timeout 4s;
    }}
    upstream fleet {{                   # the admin API and the rest: one token, spread over every replica
        least_conn;
{servers}
        keepalive 16;
        keepalive_timeout 4s;
    }}
    server {{
        listen {listen} reuseport backlog=4096;   # the kernel spreads connections evenly over the workers
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $remote_addr;   # the replicas' --forwarded-allow-ips names this host
        proxy_next_upstream error timeout http_502 http_503;
        proxy_next_upstream_tries 2;
        location / {{
            proxy_pass http://fleet;
        }}
{device_locations}
        location ~ ^/v1/devices/[^/]+/events$ {{
            proxy_pass http://fleet_devices;
            proxy_buffering off;       # push nudges go out as they are written
            proxy_read_timeout 1h;     # the stream carries a ping every 15 s
        }}
        location = /metrics {{
            allow {metrics_from};
            deny all;
            proxy_pass http://fleet;
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalNginx:
    """A throwaway nginx on a loopback port in front of `replicas` (URLs), in its own folder."""

    def __init__(self, replicas: list[str], header_timeout_s: int = 10, body_timeout_s: int = 10) -> None:
        if not Path(NGINX).exists():
            raise FleetError(f"nginx not found at {NGINX} (apt install nginx-light)")
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="edgerun-nginx-", dir="/tmp"))
        self.dir.chmod(0o755)  # nginx's workers run as an unprivileged user and keep their temporary files here
        hosts = [r.split("//", 1)[-1] for r in replicas]
        (self.dir / "nginx.conf").write_text(nginx_config(hosts, f"127.0.0.1:{self.port}",
                                                          header_timeout_s=header_timeout_s,
                                                          body_timeout_s=body_timeout_s, prefix=str(self.dir)))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalNginx:
        self.proc = subprocess.Popen([NGINX, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                                      "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        err = self.proc.stderr.read().decode() if self.proc.stderr and self.proc.poll() is not None else ""
        self.stop()
        raise FleetError(f"nginx did not start: {err[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalNginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
