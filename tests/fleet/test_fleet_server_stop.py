"""Ctrl-C on `edgerun fleet serve` with a device's push stream open: the stream ends, the server stops at once
and cleanly (no ASGI CancelledError traceback in its log)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
from fleet_helpers import start_server

from edgerun.fleet.signing import KeyDir


def test_ctrl_c_ends_open_push_streams_and_stops_without_a_traceback(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = start_server(tmp_path, keys)
    try:
        agent = server.agent("stopper", tmp_path / "agent")
        agent.check_in()  # enrolled: its token opens the stream
        with httpx.stream("GET", f"{server.url}/v1/devices/stopper/events", headers=agent._auth(),
                          timeout=30) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: hello"
            server.proc.send_signal(signal.SIGINT)
            rest = list(lines)  # ends when the server closes the stream, not at the 30 s read timeout
        assert all(not line.startswith("event: changed") for line in rest)
        assert server.proc.wait(15) == 130  # stopped by Ctrl-C, the shell's convention
    finally:
        agent.close()
        if server.proc.poll() is None:
            server.proc.kill()
    log = server.log.read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log
    assert log.rstrip().splitlines()[-2:] == ["edgerun fleet server stopped", "edgerun: interrupted"]
