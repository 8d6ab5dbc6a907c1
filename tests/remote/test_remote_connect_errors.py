"""`edgerun.connect` with a wrong scheme or an address nobody answers on fails with a clear error, never a
hang (docs/remote.md; docs/security.md, row R11). Run in a child process: a hang fails the test at the
guard instead of holding up CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgerun.errors import EdgerunError
from edgerun.fleet.local_server import free_port
from edgerun.remote.client import endpoint

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 90  # far above the 0.5 s timeout each attempt is given

_ATTEMPTS = """
import json, sys
import edgerun
from edgerun.errors import EdgerunError
out = {}
for url in json.loads(sys.argv[1]):
    try:
        edgerun.connect(url, "a-token", timeout=0.5)
        out[url] = "connected"
    except EdgerunError as exc:
        out[url] = str(exc)
print(json.dumps(out))
"""


def test_a_wrong_scheme_or_a_silent_address_is_a_clear_error() -> None:
    port = free_port()
    urls = [f"http://127.0.0.1:{port}", f"https://127.0.0.1:{port}", f"127.0.0.1:{port}", f"tcp://127.0.0.1:{port}",
            f"tcp://nohost.invalid:{port}"]
    r = subprocess.run([sys.executable, "-c", _ATTEMPTS, json.dumps(urls)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    errors = json.loads(r.stdout)
    for url in urls[:2]:
        assert errors[url] == (f"edgerun.connect takes tcp://HOST:PORT (or HOST:PORT) with a port in 1..65535, got "
                               f"{url!r}: the remote runtime speaks ZeroMQ over TCP, not HTTP")
    for url in urls[2:]:
        full = url if url.startswith("tcp://") else f"tcp://{url}"
        assert errors[url] == (f"the remote device at {full} did not answer 'hello' within 0.5 s (is the server "
                               "running? raise timeout= for long calls)")


@pytest.mark.parametrize("url", ["ws://h:1", "ipc:///tmp/x", "tcp://h", "tcp://h:0", "tcp://h:65536", "tcp://:7",
                                 "tcp://h:7/path", "h:port"])
def test_endpoints_outside_tcp_host_port_are_refused_at_once(url: str) -> None:
    with pytest.raises(EdgerunError, match=r"edgerun.connect takes tcp://HOST:PORT"):
        endpoint(url)
    assert endpoint("127.0.0.1:7000") == endpoint("tcp://127.0.0.1:7000") == "tcp://127.0.0.1:7000"
