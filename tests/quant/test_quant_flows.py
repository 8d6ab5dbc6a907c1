"""edgerun.quantize and `edgerun quantize` on a small conv + linear program: every scheme, the report, the
program file round trip and size, and the errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from small_cnn import small_cnn

import edgerun
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.program import Program
from edgerun.quantization import quantize_with_report


def images(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 4, 3, 4, 4)).repeat(4, axis=3).repeat(4, axis=4)  # smooth, image-like
    return (base + 0.3 * rng.standard_normal((n, 4, 3, 16, 16))).astype(np.float32)


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got.astype(np.float64)) ** 2)))


@pytest.mark.parametrize("scheme,ops,min_db", [
    ("int8-static", {"quantize_linear", "conv_integer", "matmul_integer"}, 30),
    ("int8-dynamic", {"dynamic_quantize", "conv_integer", "matmul_integer"}, 30),
    ("int4-weight", {"matmul_int4"}, 15),
    ("8da4w", {"dynamic_quantize", "matmul_int4"}, 15),
])
def test_every_scheme_quantizes_its_layers_and_stays_close_to_float(scheme: str, ops: set[str], min_db: float) -> None:
    program = small_cnn()
    calibration = {"image": images(4, seed=1)}
    q, _report = quantize_with_report(program, scheme, calibration if scheme == "int8-static" else None)
    counts = q.graph.op_counts()
    assert ops <= set(counts)
    assert "matmul" not in counts and ("conv2d" in counts) == scheme.startswith(("int4", "8da4w"))
    x = images(1, seed=2)[0]
    assert sqnr(interpret(program.graph, [x])[0], interpret(q.graph, [x])[0]) >= min_db
    assert q.metadata["quantization"]["scheme"] == scheme


def test_report_has_one_sqnr_per_quantized_layer() -> None:
    _, report = quantize_with_report(small_cnn(), "int8-static", {"image": images(3, seed=1)})
    assert [r.op for r in report.layers] == ["conv2d", "conv2d", "matmul", "matmul"]
    assert all(20 < r.sqnr_db < 80 for r in report.layers), report.table()
    assert "SQNR" in report.table()


def test_exclude_by_op_type_and_by_name() -> None:
    program = small_cnn()
    q = edgerun.quantize(program, "int8-dynamic", exclude=["conv2d"])
    assert q.graph.op_counts()["conv2d"] == 2 and "matmul_integer" in q.graph.op_counts()
    first_matmul = next(n.outputs[0] for n in program.graph.nodes if n.op == "matmul")
    q = edgerun.quantize(program, "int8-dynamic", exclude=[first_matmul])
    assert q.graph.op_counts()["matmul"] == 1 and q.metadata["quantization"]["excluded"] == [first_matmul]


def test_bad_input_gets_an_error_naming_it() -> None:
    program = small_cnn()
    with pytest.raises(EdgerunError, match=r"unknown quantization scheme 'int3'.*int8-static"):
        edgerun.quantize(program, "int3")
    with pytest.raises(EdgerunError, match=r"'nonesuch'.*no layer or op type"):
        edgerun.quantize(program, "int8-dynamic", exclude=["nonesuch"])
    with pytest.raises(EdgerunError, match=r"calibration arrays \['img'\].*inputs \['image'\]"):
        edgerun.quantize(program, "int8-static", calibration={"img": images(2, 1)})
    with pytest.raises(EdgerunError, match=r"calibration array 'image' has shape \(2, 4, 3, 8, 8\)"):
        edgerun.quantize(program, "int8-static", calibration={"image": images(2, 1)[:, :, :, :8, :8]})
    with pytest.raises(EdgerunError, match="needs calibration data"):
        edgerun.quantize(program, "int8-static")
    with pytest.raises(EdgerunError, match="group size"):
        edgerun.quantize(program, "int4-weight", group_size=48)


def two_inputs() -> Program:
    """ids (int64) -> embedding rows, plus a float input through a linear layer: calibration files with two
    arrays, one of them not float."""
    rng = np.random.default_rng(3)
    g = Graph()
    b = Builder(g)
    ids = g.add_input("ids", TensorSpec((1, 4), DType.int64))
    x = g.add_input("x", TensorSpec((1, 4, 16), DType.float32))
    rows = b.emit("gather", [b.const(rng.standard_normal((300, 16)).astype(np.float32)), ids], axis=0)
    g.outputs = [b.emit("add", [rows, b.emit("matmul", [x, b.const(rng.standard_normal((16, 16)).astype(np.float32))])])]
    return Program(graph=g)


def test_calibration_arrays_of_the_wrong_dtype_or_sample_count_are_named() -> None:
    program = two_inputs()
    ids, x = np.zeros((3, 1, 4), np.int64), np.zeros((3, 1, 4, 16), np.float32)
    assert len(edgerun.quantize(program, "int8-static", calibration={"ids": ids, "x": x}).graph.nodes)
    with pytest.raises(EdgerunError, match=r"calibration array 'ids' is float32; input 'ids' is int64"):
        edgerun.quantize(program, "int8-static", calibration={"ids": ids.astype(np.float32), "x": x})
    with pytest.raises(EdgerunError, match=r"different numbers of samples: \[2, 3\]"):
        edgerun.quantize(program, "int8-static", calibration={"ids": ids, "x": x[:2]})
    with pytest.raises(EdgerunError, match=r"calibration arrays \['x'\].*missing \['ids'\]"):
        edgerun.quantize(program, "int8-static", calibration={"x": x})


def mlp(width: int = 512, seed: int = 0) -> Program:
    """Two width x width linear layers: a weight-dominated program, as LLM blocks are."""
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g)
    h = g.add_input("x", TensorSpec((2, width), DType.float32))
    for _ in range(2):
        h = b.emit("matmul", [h, b.const((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32))])
    g.outputs = [h]
    return Program(graph=g)


def test_program_file_keeps_packed_weights_and_shrinks(tmp_path: Path) -> None:
    program = mlp()
    float_path, int8_path, int4_path = tmp_path / "f.edgerun", tmp_path / "q8.edgerun", tmp_path / "q4.edgerun"
    program.save(float_path)
    q8 = edgerun.quantize(program, "int8-dynamic")
    q8.save(int8_path)
    q4 = edgerun.quantize(program, "int4-weight", group_size=128)
    q4.save(int4_path)
    loaded = Program.read(int4_path)
    for name, arr in q4.graph.constants.items():  # packed uint8 nibbles come back byte for byte
        assert loaded.graph.constants[name].dtype == arr.dtype
        np.testing.assert_array_equal(loaded.graph.constants[name], arr)
    assert any(a.dtype == np.uint8 and a.ndim == 3 for a in loaded.graph.constants.values())
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    runtime_out = edgerun.load(int4_path)(x)
    np.testing.assert_array_equal(runtime_out[0] if isinstance(runtime_out, (list, tuple)) else runtime_out,
                                  interpret(q4.graph, [x])[0])
    f, s8, s4 = (os.path.getsize(p) for p in (float_path, int8_path, int4_path))
    # int8: 1 byte per weight + a scale per column; int4 group 128: 64 bytes + scale + zero point per group.
    assert f / s8 > 3.8 and f / s4 > 7.0, (f, s8, s4)


def test_cli_quantizes_a_file_and_reports_bad_input(tmp_path: Path) -> None:
    src, out, cal = tmp_path / "f.edgerun", tmp_path / "q.edgerun", tmp_path / "cal.npz"
    small_cnn().save(src)
    np.savez(cal, image=images(2, seed=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-m", "edgerun", "quantize", str(src), "-o", str(out), "--scheme",
                          "int8-static", "--calibration", str(cal)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "scheme int8-static: 4 layers quantized, 0 excluded" in run.stdout and "SQNR" in run.stdout
    assert Program.read(out).metadata["quantization"]["scheme"] == "int8-static"
    # No calibration data: the layers are still quantized and counted, only their SQNR is not measured.
    dynamic = subprocess.run([sys.executable, "-m", "edgerun", "quantize", str(src), "-o", str(out), "--scheme",
                              "int8-dynamic", "--exclude", "matmul"], capture_output=True, text=True, env=env)
    assert dynamic.returncode == 0, dynamic.stderr
    assert "scheme int8-dynamic: 2 layers quantized, 2 excluded (no per-layer SQNR without calibration data)" \
        in dynamic.stdout, dynamic.stdout
    assert Program.read(out).graph.op_counts()["conv_integer"] == 2
    np.savez(cal, pixels=images(2, seed=1))
    bad = subprocess.run([sys.executable, "-m", "edgerun", "quantize", str(src), "-o", str(out), "--scheme",
                          "int8-static", "--calibration", str(cal)], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "['pixels']" in bad.stderr and "Traceback" not in bad.stderr
    for args, named in ((["--scheme", "int3"], "unknown quantization scheme 'int3'"),
                        (["--scheme", "int8-dynamic", "--exclude", "conv9"], "--exclude ['conv9']: no layer or op type"),
                        (["--scheme", "int8-static"], "'int8-static' needs calibration data")):
        bad = subprocess.run([sys.executable, "-m", "edgerun", "quantize", str(src), "-o", str(out), *args],
                             capture_output=True, text=True, env=env)
        assert bad.returncode == 1 and named in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
    np.savez(cal, image=images(2, seed=1)[:, :, :, :8, :8])
    bad = subprocess.run([sys.executable, "-m", "edgerun", "quantize", str(src), "-o", str(out), "--scheme",
                          "int8-static", "--calibration", str(cal)], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "calibration array 'image' has shape (2, 4, 3, 8, 8)" in bad.stderr, bad.stderr


def test_embedding_tables_become_int8_rows_with_a_scale_each() -> None:
    rng = np.random.default_rng(6)
    g = Graph()
    b = Builder(g)
    ids = g.add_input("ids", TensorSpec((1, 5), DType.int64))
    table = rng.standard_normal((300, 16)).astype(np.float32) * rng.random((300, 1)).astype(np.float32)
    g.outputs = [b.emit("gather", [b.const(table), ids], axis=0)]
    program = Program(graph=g)
    q = edgerun.quantize(program, "int8-dynamic")
    assert {a.dtype for a in q.graph.constants.values() if a.size == 300 * 16} == {np.dtype(np.int8)}
    x = np.array([[0, 7, 299, 7, 42]])
    ref, got = interpret(program.graph, [x])[0], interpret(q.graph, [x])[0]
    assert np.abs(got - ref).max() <= np.abs(table).max(axis=1)[x].max() / 254 + 1e-6  # half a step of its row
    kept = edgerun.quantize(program, "int8-dynamic", exclude=["gather"])
    assert {a.dtype for a in kept.graph.constants.values() if a.size == 300 * 16} == {np.dtype(np.float32)}


def test_int8_static_keeps_convs_integer_and_folds_relu6() -> None:
    """conv -> clamp(0, 6) -> conv -> output: the first conv requantizes to uint8 with the clamp folded in and the
    second reads that uint8 value directly; the second, producing the graph output, ends in float."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("image", TensorSpec((1, 3, 16, 16), DType.float32))
    w1 = b.const((rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32))
    h = b.emit("conv2d", [x, w1, b.const(rng.standard_normal(8).astype(np.float32))], padding=[1, 1, 1, 1])
    h = b.emit("clamp", [h], min=0.0, max=6.0)
    w2 = b.const((rng.standard_normal((4, 8, 3, 3)) / 8).astype(np.float32))
    g.outputs = [b.emit("conv2d", [h, w2], padding=[1, 1, 1, 1])]
    program = Program(graph=g)
    calibration = images(4, seed=1)[:, :1]
    q = edgerun.quantize(program, "int8-static", calibration={"image": calibration})
    counts = q.graph.op_counts()
    assert counts["requantize"] == 1 and counts["quantize_linear"] == 1 and "clamp" not in counts
    requant = next(n for n in q.graph.nodes if n.op == "requantize")
    assert requant.attrs["arithmetic"] == "float32"
    assert [n.op for n in q.graph.nodes if requant.outputs[0] in n.inputs] == ["conv_integer"]
    folded = q.metadata["quantization"]["uint8_values"]
    assert list(folded) == [g.nodes[1].outputs[0]] and folded[g.nodes[1].outputs[0]]["zero_point"] == 0
    xs = calibration[0]  # inside the calibrated ranges: what is left is rounding, not clipping
    assert sqnr(interpret(program.graph, [xs])[0], interpret(q.graph, [xs])[0]) > 30


def test_int8_static_quantizes_linear_inputs_per_call_so_a_new_input_range_does_not_saturate() -> None:
    """A linear layer's input calibrated on quiet samples (std 0.1) and fed a loud one (std 1): calibrated
    ranges saturate it (static_linear=True), a per-call range (the default: dynamic_quantize, ONNX Runtime's
    DynamicQuantizeLinear) follows it. ResNet-18's pooled features did this on one held-out image."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("features", TensorSpec((4, 64), DType.float32))
    g.outputs = [b.emit("matmul", [x, b.const((rng.standard_normal((64, 10)) / 8).astype(np.float32))])]
    program = Program(graph=g)
    calibration = {"features": (0.1 * rng.standard_normal((8, 4, 64))).astype(np.float32)}
    loud = rng.standard_normal((4, 64)).astype(np.float32)
    ref = interpret(program.graph, [loud])[0]
    static = edgerun.quantize(program, "int8-static", calibration=calibration, static_linear=True)
    dynamic = edgerun.quantize(program, "int8-static", calibration=calibration)
    assert "quantize_linear" in static.graph.op_counts() and "dynamic_quantize" not in static.graph.op_counts()
    assert dynamic.graph.op_counts()["dynamic_quantize"] == 1 and "quantize_linear" not in dynamic.graph.op_counts()
    assert sqnr(ref, interpret(static.graph, [loud])[0]) < 10
    assert sqnr(ref, interpret(dynamic.graph, [loud])[0]) > 35
