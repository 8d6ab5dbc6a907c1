"""Program files whose graphs imply a 12 GiB or a 12 TiB arena: refused before allocating, with a clear error.

The attack (issue 17): shapes are just numbers, so a few hundred bytes of program file can ask for any arena;
before the limit, load() and `edgerun info` allocated it or died in a numpy MemoryError traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgerun
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.runtime.arena_limit import ENV_VAR, ArenaLimitError, arena_limit, check_arena_budget, parse_bytes

GIB, TIB = 1 << 30, 1 << 40


def relu_program(shape: tuple[int, ...]) -> Program:
    """x -> relu(x): the arena holds the input and the output, twice the input's bytes; no weights at all."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec(shape, "float32"))
    g.outputs = [b.emit("relu", [x])]
    return Program(graph=g)


TWELVE_GIB = (3 << 29,)  # 6 GiB of float32 in, 6 GiB out
TWELVE_TIB = (3 << 19, 1 << 20)  # 6 TiB in, 6 TiB out


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


@pytest.mark.parametrize("shape, arena", [(TWELVE_GIB, 12 * GIB), (TWELVE_TIB, 12 * TIB)])
def test_load_refuses_a_huge_arena_before_allocating(tmp_path: Path, shape: tuple[int, ...], arena: int) -> None:
    path = tmp_path / "big.erp"
    relu_program(shape).save(path)
    assert path.stat().st_size < 64 * 1024  # the whole attack is a tiny file
    before = _peak_rss_bytes()
    with pytest.raises(ArenaLimitError) as info:
        edgerun.load(path, arena_limit=8 * GIB)
    assert info.value.nbytes >= arena and info.value.limit == 8 * GIB
    assert f"{info.value.nbytes:,} B" in str(info.value) and "8,589,934,592 B" in str(info.value)
    assert "nothing was allocated" in str(info.value)
    assert _peak_rss_bytes() - before < 256 << 20  # the arena was never touched, let alone allocated


def test_the_12_tib_arena_is_refused_by_the_default_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    limit, source = arena_limit()
    assert 0 < limit < 12 * TIB and "available memory" in source
    with pytest.raises(ArenaLimitError, match="75% of this machine's available memory"):
        edgerun.load(relu_program(TWELVE_TIB))


def test_the_environment_variable_sets_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1G")
    with pytest.raises(ArenaLimitError, match=f"{ENV_VAR}=1G"):
        edgerun.load(relu_program((1 << 28,)))  # 2 GiB arena
    m = edgerun.load(relu_program((4,)))  # small programs are unaffected
    np.testing.assert_array_equal(m(np.float32([-1, 2, -3, 4])), [0, 2, 0, 4])
    with pytest.raises(ArenaLimitError, match="arena_limit argument"):  # the argument wins over the variable
        edgerun.load(relu_program((4,)), arena_limit=16)
    assert [parse_bytes(t) for t in ("4096", "512M", "12G", "1TiB")] == [4096, 512 << 20, 12 * GIB, TIB]
    for bad in ("lots", "-1G", "nan", ""):
        with pytest.raises(edgerun.EdgerunError, match="not a size"):
            parse_bytes(bad)
    check_arena_budget(GIB, GIB)  # equal to the limit is allowed


@pytest.mark.parametrize("shape", [TWELVE_GIB, TWELVE_TIB])
def test_edgerun_info_reports_the_arena_without_allocating(tmp_path: Path, shape: tuple[int, ...]) -> None:
    path = tmp_path / "big.erp"
    relu_program(shape).save(path)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child forked from a big pytest worker
    # would report the worker's size.
    code = ("import sys\nfrom edgerun.cli import main\nrc = main(['info', sys.argv[1]])\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "print('peak', int(hwm) * 1024)\nsys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, ENV_VAR: "8G"})
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert "needs an arena of" in proc.stderr and "above the limit of 8,589,934,592 B" in proc.stderr
    peak = int(proc.stdout.split("peak ")[1])
    assert peak < 1 * GIB  # the arena (12 GiB or 12 TiB) was never allocated
