"""`edgerun calibrate` and `edgerun plan --backends auto`: the commands a device operator runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program


def _edgerun(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGERUN_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "edgerun", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_calibrate_then_plan_with_auto(tmp_path: Path) -> None:
    proc = _edgerun("calibrate", "--backends", "reference", "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert Path(report["cache"]).exists() and Path(report["cache"]).parent.parent == tmp_path
    assert report["profiles"]["reference"]["gemm_flops_per_s"] > 0

    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 16), DType.float32))
    w = b.const(np.ones((16, 8), np.float32))
    g.outputs = [b.emit("tanh", [b.emit("matmul", [x, w])])]
    path = tmp_path / "tiny.edgerun"
    Program(g).save(path)
    proc = _edgerun("plan", str(path), "--backends", "auto:reference", "--no-measure", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "reference" in proc.stdout
    # Every candidate the search considered, modelled against measured, the chosen one marked.
    assert "modelled ms  load-time call ms" in proc.stdout and "<- chosen" in proc.stdout
