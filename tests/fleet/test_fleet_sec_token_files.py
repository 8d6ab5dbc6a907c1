"""Tokens never in argv (`ps` shows every process's arguments to every user), token files are 0600 (C8)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from fleet_helpers import REPO, FleetServer, start_server, token_file

from edgerun.fleet.signing import KeyDir


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def edgerun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGERUN_FLEET_TOKEN"}
    return subprocess.run([sys.executable, "-m", "edgerun", *args], capture_output=True, text=True, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=120)


def test_a_server_given_token_files_shows_no_token_in_its_command_line(server: FleetServer) -> None:
    argv = cmdline(server.proc.pid)
    assert "fleet" in argv and "serve" in argv and "--admin-token-file" in argv  # really the server's process
    assert not any(t in arg for arg in argv for t in (server.admin_token, server.enroll_token))


def test_generated_tokens_are_written_0600_and_stay_out_of_argv(keys: KeyDir, tmp_path: Path) -> None:
    s = start_server(tmp_path, keys, token_files=False)
    try:
        for name in ("admin_token", "enroll_token"):
            assert stat.S_IMODE((s.data / name).stat().st_mode) == 0o600, name
        assert len(s.admin_token) >= 32 and s.admin_token != s.enroll_token
        argv = cmdline(s.proc.pid)
        assert "serve" in argv and not any(t in a for a in argv for t in (s.admin_token, s.enroll_token))
        # The generated token works for the admin commands, read from the file the server wrote.
        r = edgerun("fleet", "release", "list", "--server", s.url, "--token-file", str(s.data / "admin_token"))
        assert r.returncode == 0, r.stderr
    finally:
        s.stop()


def test_token_files_others_may_read_are_refused_with_a_clear_message(server: FleetServer, tmp_path: Path) -> None:
    loose = token_file(tmp_path / "token", server.admin_token)
    loose.chmod(0o640)
    r = edgerun("fleet", "release", "list", "--server", server.url, "--token-file", str(loose))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"the token file {loose} is accessible by others (mode 0640); run: chmod 600 {loose}" in r.stderr
    r = edgerun("fleet", "serve", "--data", str(tmp_path / "data"), "--keys", str(server.keys.path),
                "--admin-token-file", str(loose))
    assert r.returncode == 1 and "chmod 600" in r.stderr and not (tmp_path / "data").exists()
    r = edgerun("fleet", "release", "list", "--server", server.url, "--token-file", str(tmp_path / "missing"))
    assert r.returncode == 1 and "cannot read the token file" in r.stderr and "Traceback" not in r.stderr
    loose.chmod(0o600)
    r = edgerun("fleet", "release", "list", "--server", server.url, "--token-file", str(loose))
    assert r.returncode == 0, r.stderr


def test_value_taking_token_flags_are_gone(tmp_path: Path) -> None:
    """Not even as abbreviations: argparse would otherwise take `--token SECRET` for `--token-file SECRET`."""
    serve = ("fleet", "serve", "--data", str(tmp_path / "d"), "--keys", str(tmp_path / "k"))
    for args in ((*serve, "--admin-token", "s3cr3t"), (*serve, "--enroll-token", "s3cr3t"),
                 (*serve, "--s3-secret-access-key", "s3cr3t"),
                 ("fleet", "release", "list", "--token", "s3cr3t"),
                 ("fleet", "keys", "rotate", "--keys", str(tmp_path / "k"), "--role", "root", "--token", "s3cr3t")):
        r = edgerun(*args)
        assert r.returncode == 2 and "unrecognized arguments: --" in r.stderr, (args, r.stderr)
