"""Loading a program needs numpy and the standard library alone: prove it in a process where torch cannot load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from program_testkit import build_sample_graph

from edgerun.program import Program

REPO_ROOT = Path(__file__).resolve().parents[2]

_LOADER = r"""
import json, sys

BLOCKED = ("torch", "onnx", "onnxruntime", "transformers", "safetensors")

class BlockHeavyImports:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: loading a program must not need it")
        return None

sys.meta_path.insert(0, BlockHeavyImports())
try:
    import torch  # noqa: F401
    blocker_works = False
except ImportError:
    blocker_works = True

from edgerun.program import Program

program = Program.read(sys.argv[1], mmap=True)
allowed = set(sys.stdlib_module_names) | {"numpy", "edgerun", "__main__", "_distutils_hack"}
third_party = sorted(m for m in sys.modules
                     if "." not in m and m not in allowed and not m.startswith("__editable__"))
print(json.dumps({
    "blocker_works": blocker_works,
    "third_party": third_party,
    "program_hash": program.program_hash(),
    "nodes": len(program.graph.nodes),
    "w_f16": program.graph.constants["w_f16"].tobytes().hex(),
}))
"""


def test_loader_imports_only_numpy_and_the_standard_library(tmp_path) -> None:
    program = Program(build_sample_graph())
    path = tmp_path / "m.edgr"
    program.save(path)
    result = subprocess.run([sys.executable, "-c", _LOADER, str(path)], capture_output=True, text=True,
                            cwd=tmp_path, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
                            timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["blocker_works"]
    assert report["third_party"] == []
    assert report["nodes"] == len(program.graph.nodes)
    assert report["program_hash"] == program.program_hash()
    assert report["w_f16"] == program.graph.constants["w_f16"].tobytes().hex()
