"""External data is checked by edgerun itself, wherever a tensor sits (main graph, If subgraph), against
`..`, absolute paths, links that lead out of the model's folder and ranges past the end of the file; a
refusal is one clean line from `edgerun import-onnx` (docs/security.md, row O1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgerun.frontends.onnx import OnnxModelError, from_onnx
from edgerun.oracle import interpret

REPO = Path(__file__).resolve().parents[2]
VALUES = np.arange(4, dtype=np.float32) + 1


def _external(name: str, location: str, offset: int = 0, length: int = 16) -> onnx.TensorProto:
    t = numpy_helper.from_array(np.zeros(4, np.float32), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=key, value=value)
    return t


def _model(where: str, location: str, path: Path, **kw: int) -> Path:
    """y = x + w, with w external: an initializer of the main graph, or a Constant inside an If branch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    if where == "graph":
        g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                              [_external("w", location, **kw)])
    else:
        s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])
        then = helper.make_graph([helper.make_node("Constant", [], ["s"], value=_external("c", location, **kw))],
                                 "then", [], [s])
        other = helper.make_graph([helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(
            np.zeros(4, np.float32), "z"))], "else", [], [s])
        g = helper.make_graph([helper.make_node("If", ["cond"], ["w"], then_branch=then, else_branch=other),
                               helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                              [numpy_helper.from_array(np.array(True), "cond")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(VALUES.tobytes())
    (model_dir / "weights.bin").write_bytes(VALUES.tobytes())
    os.symlink("../outside/secret.bin", model_dir / "out-link.bin")
    os.symlink("weights.bin", model_dir / "in-link.bin")
    return model_dir, outside


@pytest.mark.parametrize("where", ["graph", "subgraph"])
def test_external_data_inside_the_folder_loads_wherever_it_sits(folders: tuple[Path, Path], where: str) -> None:
    model_dir, _ = folders
    x = np.ones(4, np.float32)
    for location in ("weights.bin", "in-link.bin"):  # a link that stays inside the folder is fine
        path = _model(where, location, model_dir / f"{where}.onnx")
        ours = interpret(from_onnx(path).graph, [x])[0]
        np.testing.assert_array_equal(ours, x + VALUES)
        if location == "weights.bin":  # ONNX Runtime refuses every link, even one inside the folder
            theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("where", ["graph", "subgraph"])
@pytest.mark.parametrize(("location", "needle"), [
    ("../outside/secret.bin", "points outside the model's folder: '../outside/secret.bin'"),
    ("out-link.bin", "points outside the model's folder: 'out-link.bin' (through a link)"),
    ("ABS", "only a relative path inside the model's folder is allowed"),
], ids=["dotdot", "link", "absolute"])
def test_external_data_outside_the_folder_is_refused_by_edgerun(folders: tuple[Path, Path], where: str,
                                                                location: str, needle: str) -> None:
    model_dir, outside = folders
    location = str(outside / "secret.bin") if location == "ABS" else location
    path = _model(where, location, model_dir / "m.onnx")
    with pytest.raises(OnnxModelError) as info:
        from_onnx(path)
    assert needle in str(info.value) and ("'c'" if where == "subgraph" else "'w'") in str(info.value)


def test_a_range_past_the_end_of_the_file_is_refused(folders: tuple[Path, Path]) -> None:
    model_dir, _ = folders
    path = _model("subgraph", "weights.bin", model_dir / "m.onnx", offset=8, length=16)
    with pytest.raises(OnnxModelError, match=r"bytes 8\.\.24 of 'weights\.bin' are outside the file \(16 bytes\)"):
        from_onnx(path)


def test_import_onnx_prints_one_clean_line(folders: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, _ = folders
    path = _model("subgraph", "out-link.bin", model_dir / "m.onnx")
    r = subprocess.run([sys.executable, "-m", "edgerun", "import-onnx", str(path), "-o", str(tmp_path / "m.erp")],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       timeout=120)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "edgerun: error: tensor 'c' points outside the model's folder: 'out-link.bin' (through a link)"]
