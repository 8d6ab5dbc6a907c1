"""Shape rules on symbolic dimensions, and specialisation: binding checks, substitution, the static result."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.registry import infer_specs
from edgerun.ir.specialize import ShapeBindingError, bind_symbols, specialize
from edgerun.ir.symbolic import SymbolicShapeError, evaluate, sym
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret

B, S, H, W = sym("batch"), sym("seq"), sym("h"), sym("w")
F32 = DType.float32


def spec(*shape: object, dtype: DType = F32) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)  # type: ignore[arg-type]


def out(op: str, ins: list[TensorSpec], **attrs: object) -> tuple[object, ...]:
    return infer_specs(op, ins, attrs)[0].shape


W_SPEC = spec(8, 3, 3, 3)


@pytest.mark.parametrize("op, ins, attrs, want", [
    ("add", [spec(B, S, 32), spec(32)], {}, (B, S, 32)),
    ("add", [spec(B, 1, 32), spec(1, S, 1)], {}, (B, S, 32)),
    ("matmul", [spec(B, S, 32), spec(32, 64)], {}, (B, S, 64)),
    ("matmul", [spec(B, 4, S, 8), spec(B, 4, 8, S)], {}, (B, 4, S, S)),
    ("linear", [spec(B, S, 32), spec(64, 32)], {}, (B, S, 64)),
    ("conv2d", [spec(B, 3, H, W), W_SPEC], {"stride": [2, 2], "padding": [1, 1, 1, 1]},
     (B, 8, (H - 1) // 2 + 1, (W - 1) // 2 + 1)),
    ("max_pool2d", [spec(B, 8, H, W)], {"kernel": [2, 2]}, (B, 8, (H - 2) // 2 + 1, (W - 2) // 2 + 1)),
    ("avg_pool2d", [spec(B, 8, H, W)], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1, 1, 1]},
     (B, 8, H, W)),
    ("adaptive_avg_pool2d", [spec(B, 8, H, W)], {"output_size": [1, 1]}, (B, 8, 1, 1)),
    ("layer_norm", [spec(B, S, 32), spec(32), spec(32)], {}, (B, S, 32)),
    ("softmax", [spec(B, S, S)], {"axis": -1}, (B, S, S)),
    ("reduce_sum", [spec(B, S, 32)], {"axes": [1]}, (B, 32)),
    ("reshape", [spec(B, S, 32)], {"shape": [B, S, 4, 8]}, (B, S, 4, 8)),
    ("reshape", [spec(B, S, 32)], {"shape": [B, -1]}, (B, 32 * S)),
    ("reshape", [spec(B, S, 4, 8)], {"shape": [-1, 32]}, (B * S, 32)),
    ("flatten", [spec(B, 8, H, W)], {"start": 1}, (B, 8 * H * W)),
    ("transpose", [spec(B, S, 4, 8)], {"perm": [0, 2, 1, 3]}, (B, 4, S, 8)),
    ("slice", [spec(B, S, 32)], {"starts": [-1], "ends": [2**63 - 1], "axes": [1]}, (B, 1, 32)),
    ("slice", [spec(B, S, 32)], {"starts": [1], "ends": [-1], "axes": [1]}, (B, S - 2, 32)),
    ("slice", [spec(B, S, 32)], {"starts": [0], "ends": [2**63 - 1], "axes": [1], "steps": [2]},
     (B, (S + 1) // 2, 32)),
    ("slice", [spec(64, 32)], {"starts": [0], "ends": [S], "axes": [0]}, (S, 32)),
    ("concat", [spec(B, S, 32), spec(B, 3, 32)], {"axis": 1}, (B, S + 3, 32)),
    ("split", [spec(B, S, 96)], {"axis": 2, "sizes": [32, 32, 32]}, (B, S, 32)),
    ("split", [spec(B, 2 * S, 4)], {"axis": 1, "sizes": [S, S]}, (B, S, 4)),
    ("expand", [spec(B, 1, 32)], {"shape": [B, S, 32]}, (B, S, 32)),
    ("pad", [spec(B, S, 32)], {"pads": [[0, 0], [1, 2], [0, 0]]}, (B, S + 3, 32)),
    ("gather", [spec(100, 32), spec(B, S, dtype=DType.int64)], {"axis": 0}, (B, S, 32)),
    ("scaled_dot_product_attention", [spec(B, 4, S, 8)] * 3, {"is_causal": True}, (B, 4, S, 8)),
    ("dim_value", [], {"value": S * B}, ()),
    ("batch_norm", [spec(B, 8, H, W)] + [spec(8)] * 4, {}, (B, 8, H, W)),
    ("rms_norm", [spec(B, S, 32), spec(32)], {}, (B, S, 32)),
    ("gelu", [spec(B, S, 32)], {}, (B, S, 32)),
    ("where", [spec(1, S, dtype=DType.bool), spec(B, S), spec()], {}, (B, S)),
    ("cast", [spec(B, S)], {"dtype": "int64"}, (B, S)),
    ("argmax", [spec(B, S, 10)], {"axis": -1}, (B, S)),
    ("log_softmax", [spec(B, S)], {"axis": 1}, (B, S)),
])
def test_rules_compute_with_symbols(op: str, ins: list[TensorSpec], attrs: dict, want: tuple) -> None:
    assert out(op, ins, **attrs) == want


@pytest.mark.parametrize("op, ins, attrs, match", [
    ("max_pool2d", [spec(B, 8, H, W)], {"kernel": [2, 2], "ceil_mode": True}, "max_pool2d: ceil_mode.*'h'"),
    ("slice", [spec(B, S, 32)], {"starts": [5], "ends": [0], "axes": [1], "steps": [-1]},
     "slice: a negative-step slice of symbolic axis 'seq'"),
])
def test_rules_that_need_a_value_name_op_and_symbol(op: str, ins: list[TensorSpec], attrs: dict, match: str) -> None:
    with pytest.raises(SymbolicShapeError, match=match):
        infer_specs(op, ins, attrs)


def test_mismatched_symbols_do_not_broadcast() -> None:
    with pytest.raises(ValueError, match="do not broadcast"):
        out("add", [spec(B, S), spec(B, H)])


def _template() -> Graph:
    g = Graph(symbols={"batch": (1, 4), "seq": (2, 16)})
    b = Builder(g)
    x = g.add_input("x", spec(B, S, 8))
    y = g.add_input("y", spec(B, 2 * S))
    w = b.const(np.arange(64, dtype=np.float32).reshape(8, 8) / 64)
    h = b.emit("reshape", [b.emit("linear", [x, w])], shape=[B, -1])
    z = b.emit("concat", [h, b.emit("expand", [y], shape=[B, 2 * S])], axis=1)
    scale = b.emit("cast", [b.emit("dim_value", [], value=S)], dtype="float32")
    g.outputs = [b.emit("mul", [b.emit("softmax", [z], axis=-1), scale])]
    verify(g)
    return g


def test_bind_symbols_checks_bounds_consistency_and_expressions() -> None:
    g = _template()
    assert bind_symbols(g, {"x": (3, 5, 8), "y": (3, 10)}) == {"batch": 3, "seq": 5}
    for shapes, match in [
        ({"x": (3, 17, 8), "y": (3, 34)}, r"input 'x' dimension 1 is 17: symbol 'seq' must be within \[2, 16\]"),
        ({"x": (3, 5, 8), "y": (2, 10)}, r"input 'y' dimension 0 is 2, but symbol 'batch' is already 3"),
        ({"x": (3, 5, 8), "y": (3, 11)}, r"input 'y' dimension 1 is 11, but the program needs 2\*seq = 10"),
        ({"x": (3, 5, 9), "y": (3, 10)}, r"input 'x' dimension 2 is 9, the program needs 8"),
        ({"x": (3, 5), "y": (3, 10)}, r"input 'x' has rank 2"),
    ]:
        with pytest.raises(ShapeBindingError, match=match):
            bind_symbols(g, shapes)


def test_symbol_only_inside_expressions_cannot_be_bound() -> None:
    g = Graph(symbols={"seq": (1, 8)})
    g.add_input("y", spec(S + 1))
    with pytest.raises(ShapeBindingError, match="no input dimension is symbol 'seq' alone"):
        bind_symbols(g, {"y": (4,)})


def test_a_symbol_seen_only_as_a_multiple_binds_from_it() -> None:
    """from_onnx's (name, min, max, multiple) dimensions: 32*H_div32 binds H_div32 = size / 32."""
    g = Graph(symbols={"seq": (1, 8)})
    g.add_input("y", spec(2 * S))
    assert bind_symbols(g, {"y": (4,)}) == {"seq": 2}
    with pytest.raises(ShapeBindingError, match="input 'y' dimension 0 is 5: the program needs a multiple of 2"):
        bind_symbols(g, {"y": (5,)})
    with pytest.raises(ShapeBindingError, match=r"2\*seq must be within \[2, 16\]"):
        bind_symbols(g, {"y": (18,)})


def test_specialised_graph_is_static_verified_and_computes_like_its_rules() -> None:
    g = _template()
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 2), (4, 16), (2, 7)]:
        concrete = specialize(g, {"batch": batch, "seq": seq})
        assert not concrete.symbols and all(s.is_static for s in concrete.specs.values())
        verify(concrete)
        for name in g.specs:
            assert concrete.specs[name].shape == tuple(evaluate(d, {"batch": batch, "seq": seq})
                                                       for d in g.specs[name].shape)
        x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
        y = rng.standard_normal((batch, 2 * seq)).astype(np.float32)
        result = interpret(concrete, {"x": x, "y": y})[0]
        z = np.concatenate([(x @ (np.arange(64, dtype=np.float32).reshape(8, 8) / 64).T).reshape(batch, -1), y], 1)
        e = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(result, e / e.sum(-1, keepdims=True) * seq, rtol=1e-5)
    assert "dim_value" in g.op_counts()


def test_template_graph_needs_specialising_before_it_runs() -> None:
    with pytest.raises(EdgerunError, match="symbolic dimension"):
        np.zeros(spec(B, 3).shape)


def test_a_size_the_bounds_fix_is_that_number_so_a_reshape_by_it_is_proved() -> None:
    """PP-OCRv4's recognizer pools its height H to (H + 15)//48 rows and reshapes as if it were 1: true for
    every H in 33..80. The builder writes such a size as the number the bounds fix, so the reshape is proved
    for every size in them (one plan); with bounds where it is not always 1 the reshape is still refused."""
    for bounds, proved in (((33, 80), True), ((33, 96), False)):
        g = Graph(symbols={"batch": (1, 4), "h": bounds, "w": (1, 64)})
        b = Builder(g)
        x = g.add_input("x", spec(B, 8, H, W))
        rows = b.emit("max_pool2d", [x], kernel=[48, 1], padding=[15, 0, 0, 0])  # [batch, 8, (h + 15)//48, w]
        if not proved:
            assert g.specs[rows].shape[2] == (H + 15) // 48
            with pytest.raises(ValueError, match="cannot reshape"):
                b.emit("reshape", [rows], shape=[B, 8, W])
            continue
        assert g.specs[rows].shape == (B, 8, 1, W)
        g.outputs = [b.emit("reshape", [rows], shape=[B, 8, W])]
        verify(g)  # the verifier infers the fixed size too
        x_value = np.random.default_rng(0).standard_normal((2, 8, 40, 5)).astype(np.float32)
        got = interpret(specialize(g, {"batch": 2, "h": 40, "w": 5}), {"x": x_value})[0]
        np.testing.assert_array_equal(got, x_value[:, :, :33].max(axis=2))  # rows 0..32: the window padded by 15


def test_a_template_saved_with_the_symbolic_form_of_a_fixed_size_still_verifies() -> None:
    g = Graph(symbols={"batch": (1, 4), "h": (33, 80), "w": (1, 64)})
    x = g.add_input("x", spec(B, 8, H, W))
    (rows,) = g.add_node("max_pool2d", [x], [spec(B, 8, (H + 15) // 48, W)], {"kernel": [48, 1], "padding": [15, 0, 0, 0]})
    g.outputs = [rows]
    verify(g)
