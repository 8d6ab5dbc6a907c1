"""The README's commands, run as written on a fresh copy of the repository.

Every ```bash and ```python block of the README (and of the getting-started guides) runs, in order, in one
copy of the tracked files with the project's .venv active, so a later block may use what an earlier one made
(`model.edgerun`, `real.npz`). A block that cannot run here says so in an HTML comment right above it,
`<!-- not run by tests/test_readme_commands.py: WHY -->`, and names what tests it instead. The blocks export
models with torch and read real weights, so running them is slow; parsing every `edgerun` command line with
the real argument parser (a renamed flag in the docs fails here at once) is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "start").glob("*.md"))]
SKIP = re.compile(r"<!-- not run by tests/test_readme_commands\.py: (.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None  # why it is not run, from the comment above it

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w+)\s*$", lines[i])
        if m and m.group(1) in ("bash", "python"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = SKIP.match(above)
            yield Block(str(path.relative_to(ROOT)), i + 1, m.group(1), "\n".join(lines[i + 1:end]),
                        skip.group(1) if skip else None)
            i = end
        i += 1


ALL = [b for page in PAGES for b in blocks(page)]


def edgerun_commands(block: Block) -> Iterator[list[str]]:
    """The `edgerun ...` command lines of a bash block, continuation lines joined, variables left as words."""
    text = re.sub(r"\\\n\s*", " ", block.code)
    for line in text.splitlines():
        line = line.split(" #")[0].strip().rstrip("&").strip()
        words = shlex.split(line, comments=True) if line else []
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
            words = words[1:]
        if words and words[0].endswith("edgerun") and words[0] in ("edgerun", ".venv/bin/edgerun"):
            yield words[1:]


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "bash"], ids=str)
def test_every_documented_edgerun_command_parses(block: Block) -> None:
    from edgerun.cli import build_parser

    parser = build_parser()
    for argv in edgerun_commands(block):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block}: `edgerun {' '.join(argv)}` does not parse (exit {exc.code})")


def test_every_block_runs_or_says_why_not() -> None:
    assert ALL, "no command blocks found"
    for b in ALL:
        assert b.skip is None or len(b.skip) > 20, f"{b}: say why the block is not run and what tests it"


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked (and untracked, not ignored) files, as a fresh clone would have them, with the .venv."""
    dest = tmp_path_factory.mktemp("fresh") / "edgerun"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


def _digests(root: Path) -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in filter(None, listed)
            if (root / rel).is_file() and not (root / rel).is_symlink()}


@pytest.fixture(scope="module")
def tracked_before(fresh_copy: Path) -> dict[str, str]:
    return _digests(fresh_copy)


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in ALL if b.skip is None], ids=str)
def test_the_block_runs_as_written(block: Block, fresh_copy: Path, tracked_before: dict[str, str]) -> None:
    env = {**os.environ, "PATH": f"{fresh_copy / '.venv' / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(fresh_copy),
           "VIRTUAL_ENV": str(fresh_copy / ".venv")}
    if block.lang == "python":
        script = fresh_copy / f"block_{Path(block.page).stem}_{block.line}.py"
        script.write_text(block.code + "\n")
        argv = [str(fresh_copy / ".venv" / "bin" / "python"), str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    # Its own session: a block that starts a server in the background (`edgerun serve ... &`) leaves it
    # running, holding the output file open; the block is done when its shell exits, and the whole group is
    # ended after it.
    log = fresh_copy / f"block_{Path(block.page).stem}_{block.line}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=fresh_copy, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=480)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, f"{block} failed (exit {proc.returncode}):\n{log.read_text()[-4000:]}"


@pytest.mark.slow
def test_no_block_wrote_into_a_tracked_file(fresh_copy: Path, tracked_before: dict[str, str]) -> None:
    """Scripts write their reports and results beside the user's files, never over the repository's own
    (`bench/webgpu_migrate.py` once rewrote docs/webgpu-migration.md by default)."""
    after = _digests(fresh_copy)
    assert [rel for rel, digest in tracked_before.items() if after.get(rel) != digest] == []
