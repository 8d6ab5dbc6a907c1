"""`edgerun import-onnx` writes a program file that loads and runs like the ONNX model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgerun.backends.reference.interpreter import interpret
from edgerun.cli import main
from edgerun.program import Program


def test_import_onnx_cli(tmp_path, capsys):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src, out = tmp_path / "m.onnx", tmp_path / "m.edgerun"
    src.write_bytes(model.SerializeToString())
    assert main(["import-onnx", str(src), "-o", str(out), "--input-shape", "x=3,8"]) == 0
    assert "wrote" in capsys.readouterr().out
    program = Program.read(out)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(interpret(program.graph, [x])[0], want[0], rtol=1e-5, atol=1e-6)


def test_import_onnx_cli_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert main(["import-onnx", str(bad), "-o", str(tmp_path / "x.edgerun")]) == 1
    assert "edgerun: error:" in capsys.readouterr().err
