"""The runtime needs numpy alone: programs of every kind (a plain one, methods sharing state, a template
specialised per shape, one holding a guard checked per shape, a quantized one) load and run in a process where importing torch or onnx fails,
and give what they gave here. docs/design.md's layer list puts every frontend above the runtime and the
search (tests/test_layering.py); this is the same claim checked by running."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import edgerun
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import sym
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program

SPEC = TensorSpec((2, 3), DType.float32)


def plain() -> Program:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 16), DType.float32))
    w = b.const(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    g.outputs = [b.emit("softmax", [b.emit("tanh", [b.emit("matmul", [x, w])])], axis=-1)]
    return Program(g, {"producer": "test"})


def with_methods_and_state() -> Program:
    def method(read_only: bool) -> Graph:
        g = Graph()
        b = Builder(g)
        x = g.add_input("x", SPEC)
        g.specs["acc"] = SPEC
        g.state_inputs.append("acc")
        new = b.binary("add", "acc", x)
        g.outputs = [b.binary("mul", new, b.const(np.float32(2.0)))]
        if not read_only:
            g.state_updates["acc"] = new
        return g
    return Program.from_methods({"forward": method(False), "peek": method(True)},
                                state={"acc": np.zeros((2, 3), np.float32)})


def template() -> Program:
    g = Graph(symbols={"n": (1, 64)})
    b = Builder(g)
    x = g.add_input("x", TensorSpec((sym("n"), 4), DType.float32))
    w = b.const(np.arange(12, dtype=np.float32).reshape(3, 4))
    g.outputs = [b.emit("softmax", [b.emit("linear", [x, w])], axis=0)]
    return Program(g, {"producer": "test"})


def guarded() -> Program:
    """x [N, L] reshaped to [N, (L + 15) // 48, L] under a guard (what the ONNX import makes of PP-OCRv4's
    recognizer): it runs where (L + 15) // 48 is 1 and refuses other sizes at their call."""
    n, length = sym("N"), sym("L")
    g = Graph(symbols={"N": (1, 8), "L": (1, 1 << 20)})
    b = Builder(g)
    x = g.add_input("x", TensorSpec((n, length), DType.float32))
    y = b.emit("reshape", [x], shape=[n, (length + 15) // 48, length], guard="the test's Reshape")
    g.outputs = [b.emit("relu", [y])]
    return Program(g, {"producer": "test"})


CHILD = textwrap.dedent("""
    import importlib.abc, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname.partition(".")[0] in ("torch", "onnx", "torchvision", "transformers"):
                raise ModuleNotFoundError(f"No module named {fullname!r} (refused)", name=fullname)
            return None

    sys.meta_path.insert(0, Refuse())
    import numpy as np
    import edgerun

    folder = sys.argv[1]
    want = np.load(f"{folder}/want.npz")
    x4, x23 = want["x4"], want["x23"]
    for backends in (None, "auto"):
        got = edgerun.load(f"{folder}/plain.edgerun", backends=backends)(x4)
        np.testing.assert_allclose(got, want["plain"], rtol=1e-5, atol=1e-6)
    m = edgerun.load(f"{folder}/state.edgerun")
    m(x23)
    np.testing.assert_allclose(m.run_method("peek", x23), want["state"], rtol=1e-6)
    t = edgerun.load(f"{folder}/template.edgerun")
    for n in (3, 5):
        np.testing.assert_allclose(t(want[f"t{n}"]), want[f"template{n}"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(edgerun.load(f"{folder}/quantized.edgerun")(x4), want["quantized"], rtol=1e-5,
                               atol=1e-6)
    g = edgerun.load(f"{folder}/guarded.edgerun")
    np.testing.assert_allclose(g(want["g40"]), want["guarded40"])
    try:
        g(np.zeros((1, 96), np.float32))
        raise AssertionError("a size failing the guard ran")
    except edgerun.EdgerunError as exc:
        assert "the test's Reshape needs" in str(exc), exc
    assert not {"torch", "onnx"} & set(sys.modules), sorted({"torch", "onnx"} & set(sys.modules))
    print("ran", len(want.files))
""")


def test_programs_of_every_kind_load_and_run_where_torch_and_onnx_cannot_be_imported(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x4 = rng.standard_normal((4, 16)).astype(np.float32)
    x23 = rng.standard_normal((2, 3)).astype(np.float32)
    t3, t5 = (rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 5))
    programs = {"plain": plain(), "state": with_methods_and_state(), "template": template(),
                "quantized": edgerun.quantize(plain(), "int8-dynamic"), "guarded": guarded()}
    g40 = rng.standard_normal((2, 40)).astype(np.float32)
    for name, program in programs.items():
        program.save(tmp_path / f"{name}.edgerun")
    state = edgerun.load(programs["state"])
    state(x23)
    t = edgerun.load(programs["template"])
    want = {"x4": x4, "x23": x23, "t3": t3, "t5": t5, "plain": edgerun.load(programs["plain"])(x4),
            "state": state.run_method("peek", x23), "template3": t(t3), "template5": t(t5),
            "quantized": edgerun.load(programs["quantized"])(x4), "g40": g40,
            "guarded40": edgerun.load(programs["guarded"])(g40)}
    np.testing.assert_array_equal(want["guarded40"], np.maximum(g40, 0).reshape(2, 1, 40))
    assert any(n.op.endswith("integer") or "quant" in n.op for n in programs["quantized"].graph.nodes)
    np.savez(tmp_path / "want.npz", **want)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"ran {len(want)}"
