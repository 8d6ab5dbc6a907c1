"""The standalone stream end takes its tokens from files (0600) or the environment, never argv: `ps` and
/proc/PID/cmdline show every process's arguments to every user (issue #17, C8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from stream_helpers import REPO, CloudServer, free_port, token_file

DEVICES = {"dev-a": "device-secret-a-0123456789", "dev-b": "device-secret-b-0123456789"}
ADMIN = "admin-secret-0123456789"


def cloud_app(*args: str, module: tuple[str, ...] = ("edgerun.stream.cloud_app",)) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGERUN_STREAM_ADMIN_TOKEN"}
    return subprocess.run([sys.executable, "-m", *module, *args], capture_output=True, text=True, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=120)


def test_the_running_cloud_server_shows_no_token_in_its_command_line(tmp_path: Path) -> None:
    cloud = CloudServer(tmp_path, DEVICES, admin_token=ADMIN).start()
    try:
        assert cloud.proc is not None
        argv = Path(f"/proc/{cloud.proc.pid}/cmdline").read_bytes().decode().split("\0")
        assert "edgerun.stream.cloud_app" in argv and "--device-tokens-file" in argv and "--admin-token-file" in argv
        assert not any(t in arg for arg in argv for t in (ADMIN, *DEVICES.values()))
        # The tokens from the files are the ones the server checks.
        assert httpx.get(f"{cloud.url}/stats", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert httpx.get(f"{cloud.url}/stats", headers={"Authorization": f"Bearer {DEVICES['dev-a']}"}).status_code == 403
        assert cloud.records(token=DEVICES["dev-b"], device_id="dev-b") == []
    finally:
        cloud.stop()


def test_loose_or_malformed_token_files_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    base = ("--db", f"sqlite:///{tmp_path / 'cloud.db'}", "--port", str(free_port()))
    loose = token_file(tmp_path / "admin", ADMIN)
    loose.chmod(0o644)
    r = cloud_app(*base, "--admin-token-file", str(loose))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"the token file {loose} is accessible by others (mode 0644); run: chmod 600 {loose}" in r.stderr
    bad = token_file(tmp_path / "devices", f"# devices\ndev-a={DEVICES['dev-a']}\n{DEVICES['dev-b']}")
    r = cloud_app(*base, "--device-tokens-file", str(bad))
    assert r.returncode == 1 and f"{bad} line 3: expected DEVICE=TOKEN" in r.stderr
    assert DEVICES["dev-b"] not in r.stderr and "Traceback" not in r.stderr  # the message never echoes a token
    r = cloud_app(*base, "--device-tokens-file", str(tmp_path / "missing"), module=("edgerun", "stream", "cloud"))
    assert r.returncode == 1 and "cannot read the token file" in r.stderr and "Traceback" not in r.stderr


def test_value_taking_token_flags_are_gone(tmp_path: Path) -> None:
    """Not even as abbreviations of the file options."""
    base = ("--db", f"sqlite:///{tmp_path / 'cloud.db'}", "--port", str(free_port()))
    for module, args in ((("edgerun.stream.cloud_app",), ("--admin-token", "s3cr3t")),
                         (("edgerun.stream.cloud_app",), ("--device-token", "dev=s3cr3t")),
                         (("edgerun", "stream", "cloud"), ("--admin-token", "s3cr3t"))):
        r = cloud_app(*base, *args, module=module)
        assert r.returncode == 2 and "unrecognized arguments: --" in r.stderr, (args, r.stderr)
