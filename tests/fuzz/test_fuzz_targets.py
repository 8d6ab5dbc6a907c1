"""The fuzzers of edgerun's parsers of untrusted bytes (fuzz/, atheris), bounded for CI: every stored input
(seed corpus and every past finding in fuzz/regressions) is replayed, and each fuzzer runs a fixed number
of executions from its corpus with no finding. Long runs: bench/fuzz_long.py. See docs/security.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import CORPUS, REGRESSIONS, TARGETS

REPO = Path(__file__).resolve().parents[2]
# Executions per target in CI, sized so the whole tier (pytest, the replays and the six runs) stays under
# 30 s on an idle 2-core box even run one test at a time: CPU seconds of each run with these counts
# (start-up, mostly instrumenting, included; `/usr/bin/time python -m fuzz.run T -runs=N -seed=1`):
# gguf 5.9, onnx_model 3.9, program_file 1.9, task_package 1.6, stream_batch 1.5, remote_wire 1.4;
# the whole tier 17.0 s wall with the box nearly idle (load average 1.0).
CI_RUNS = {"remote_wire": 50000, "stream_batch": 20000, "program_file": 20000, "task_package": 5000,
           "onnx_model": 5000, "gguf": 2000}


def _inputs(target: str) -> list[Path]:
    return sorted(p for d in (CORPUS / target, REGRESSIONS / target) if d.is_dir() for p in d.iterdir())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_stored_input_is_refused_cleanly(target: str) -> None:
    inputs = _inputs(target)
    assert any(p.name.startswith("seed-") for p in inputs), f"no seed corpus for {target}"
    for path in inputs:
        TARGETS[target](path.read_bytes())  # an escaping exception is a finding: the test fails naming it


def test_every_target_has_a_ci_run() -> None:
    assert sorted(CI_RUNS) == sorted(TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_bounded_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    runs = CI_RUNS[target]
    fuzz = [sys.executable, "-m", "fuzz.run", target, "--work", str(tmp_path), f"-runs={runs}", "-seed=1",
            "-timeout=20", "-rss_limit_mb=2048"]
    # libFuzzer's RSS limit reads the process's peak RSS (ru_maxrss), and Linux carries the parent's peak across
    # exec: launched straight from a pytest worker that once held 2 GB, the fuzzer starts "over the limit". A shell
    # that forks it (the `; exit` keeps sh from exec'ing in place) gives it a peak of its own.
    r = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', *fuzz], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    crashes = sorted(p.name for p in tmp_path.glob("crash-*")) + sorted(p.name for p in tmp_path.glob("timeout-*"))
    assert r.returncode == 0 and not crashes, f"{target}: {crashes}\n{r.stderr[-3000:]}"
    assert re.search(rf"Done {runs} runs in", r.stderr), r.stderr[-2000:]
