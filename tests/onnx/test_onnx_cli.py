"""`edgerun import-onnx` writes a program file that loads and runs like the ONNX model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgerun.cli import main
from edgerun.oracle import interpret
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


def test_import_onnx_cli_saves_a_model_with_value_deciding_inputs(tmp_path, capsys):
    """Reshape's target is a graph input: the file keeps the ONNX model, which the ONNX frontend opens and
    specialises per target at load (the runtime itself needs numpy alone and refuses such a file by name)."""
    import edgerun
    from edgerun.frontends.onnx import ValueTemplate
    from edgerun.program import Program

    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6]),
                                            helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src, out = tmp_path / "m.onnx", tmp_path / "m.edgerun"
    src.write_bytes(model.SerializeToString())
    assert main(["import-onnx", str(src), "-o", str(out), "--input-shape", "x=4,6"]) == 0
    assert "wrote" in capsys.readouterr().out
    loaded = edgerun.load(ValueTemplate.from_program(Program.read(out)))
    assert loaded.value_inputs == ["shape"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for target in ([3, 8], [-1, 2], [24, 1]):
        shape = np.array(target, np.int64)
        np.testing.assert_array_equal(loaded(x, shape), sess.run(None, {"x": x, "shape": shape})[0])


def test_import_onnx_cli_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert main(["import-onnx", str(bad), "-o", str(tmp_path / "x.edgerun")]) == 1
    assert "edgerun: error:" in capsys.readouterr().err


def test_from_onnx_and_import_onnx_make_the_same_program(tmp_path):
    # One way to make a program: from_onnx and the CLI both go graph -> default pipeline -> Program.
    from edgerun.frontends.onnx import from_onnx, import_onnx_graph
    from edgerun.frontends.program_maker import make_program
    from edgerun.passes import METADATA_KEY

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
             helper.make_node("MatMul", ["u", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    src, out = tmp_path / "m.onnx", tmp_path / "m.edgerun"
    src.write_bytes(model.SerializeToString())
    assert main(["import-onnx", str(src), "-o", str(out)]) == 0
    saved = Program.read(out)
    made = from_onnx(str(src))
    direct = make_program(import_onnx_graph(str(src)), frontend="onnx")
    assert made.metadata["frontend"] == saved.metadata["frontend"] == "onnx"
    assert [r["name"] for r in made.metadata[METADATA_KEY]] == [r["name"] for r in saved.metadata[METADATA_KEY]]
    assert made.graph.op_counts() == saved.graph.op_counts() == direct.graph.op_counts()
    # The passes ran: the two transposes cancel into nothing (or one copy), not two rasters.
    assert made.graph.op_counts().get("raster", 0) <= 1
    unoptimized = from_onnx(str(src), optimize=False)
    assert METADATA_KEY not in unoptimized.metadata
