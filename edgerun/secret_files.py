"""Secrets read from files (mode 0600) or the environment, never from argv: `ps` and /proc/PID/cmdline show
every process's arguments to every user. The fleet server and CLI and the stream cloud end read theirs here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edgerun.errors import EdgerunError


def read_secret_file(path: str | Path) -> str:
    """The file's text, stripped. A file that group or others may access is refused, not warned about: a
    warning scrolls past in a service log while the secret stays readable, and `chmod 600` is a one-line fix
    (ssh does the same with private keys). Messages name the file, never its contents."""
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EdgerunError(f"the token file {path} is accessible by others (mode {mode & 0o777:04o}); "
                               f"run: chmod 600 {path}")
        text = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgerunError(f"cannot read the token file {path}: "
                           f"{getattr(exc, 'strerror', None) or 'not UTF-8 text'}") from None
    if not text:
        raise EdgerunError(f"the token file {path} is empty")
    return text


def secret_from(path: str | None, env: str) -> str:
    """A token from the file at `path` if one is given, else from the variable `env` ("" when unset)."""
    return read_secret_file(path) if path else os.environ.get(env, "").strip()
