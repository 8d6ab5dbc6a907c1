"""Every composite op, decomposed into atomic ops and raster, matches PyTorch eager on random inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from numpy_only import lazy

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes.decompose_pass import DecomposePass

# The outside oracles, imported by the tests that use them (the others run in the numpy-only tier).
torch = lazy("torch")
F = lazy("torch.nn.functional")

Case = tuple[str, Callable[[Builder, list[str]], object], Callable[..., object], list[tuple[int, ...]]]

CASES: list[Case] = [
    ("transpose", lambda b, x: b.emit("transpose", x, perm=[0, 2, 3, 1]), lambda x: x.permute(0, 2, 3, 1),
     [(2, 3, 4, 5)]),
    ("transpose", lambda b, x: b.emit("transpose", x, perm=[4, 2, 0, 3, 1]),
     lambda x: x.permute(4, 2, 0, 3, 1), [(2, 3, 4, 5, 6)]),
    ("reshape", lambda b, x: b.emit("reshape", x, shape=[6, -1]), lambda x: x.reshape(6, -1), [(2, 3, 4)]),
    ("flatten", lambda b, x: b.emit("flatten", x, start=1), lambda x: x.flatten(1), [(2, 3, 4)]),
    ("slice", lambda b, x: b.emit("slice", x, starts=[1, -1], ends=[3, -100], axes=[1, 3], steps=[1, -2]),
     lambda x: torch.flip(x, [3])[:, 1:3, :, 0:5:2], [(2, 3, 4, 5)]),
    ("concat", lambda b, x: b.emit("concat", x, axis=1), lambda a, c: torch.cat([a, c], 1), [(2, 3, 4), (2, 5, 4)]),
    ("split", lambda b, x: b.emit_multi("split", x, axis=2, sizes=[1, 3]),
     lambda a: list(torch.split(a, [1, 3], 2)), [(2, 3, 4)]),
    ("pad", lambda b, x: b.emit("pad", x, pads=[[0, 0], [0, 0], [1, 2], [-1, 3]], value=1.5),
     lambda a: F.pad(a, (-1, 3, 1, 2), value=1.5), [(2, 3, 4, 5)]),
    ("pad", lambda b, x: b.emit("pad", x, pads=[[0, 0], [0, 0], [1, 2], [3, 1]], mode="reflect"),
     lambda a: F.pad(a, (3, 1, 1, 2), mode="reflect"), [(2, 3, 4, 5)]),
    ("pad", lambda b, x: b.emit("pad", x, pads=[[0, 0], [0, 0], [1, 2], [3, 1]], mode="edge"),
     lambda a: F.pad(a, (3, 1, 1, 2), mode="replicate"), [(2, 3, 4, 5)]),
    ("expand", lambda b, x: b.emit("expand", x, shape=[2, 3, 4, 5]), lambda a: a.expand(2, 3, 4, 5), [(3, 1, 5)]),
    ("relu", lambda b, x: b.emit("relu", x), lambda a: F.relu(a), [(2, 7, 3)]),
    ("clamp", lambda b, x: b.emit("clamp", x, min=-0.5, max=0.25), lambda a: a.clamp(-0.5, 0.25), [(2, 7)]),
    ("leaky_relu", lambda b, x: b.emit("leaky_relu", x, alpha=0.1), lambda a: F.leaky_relu(a, 0.1), [(9,)]),
    ("softmax", lambda b, x: b.emit("softmax", x, axis=1), lambda a: torch.softmax(a, 1), [(2, 7, 3)]),
    ("log_softmax", lambda b, x: b.emit("log_softmax", x, axis=-1), lambda a: torch.log_softmax(a, -1),
     [(2, 7, 3)]),
    ("gelu", lambda b, x: b.emit("gelu", x), lambda a: F.gelu(a), [(2, 7, 3)]),
    ("gelu", lambda b, x: b.emit("gelu", x, approximate="tanh"), lambda a: F.gelu(a, approximate="tanh"),
     [(2, 7, 3)]),
    ("silu", lambda b, x: b.emit("silu", x), lambda a: F.silu(a), [(2, 7, 3)]),
    ("hardsigmoid", lambda b, x: b.emit("hardsigmoid", x), lambda a: F.hardsigmoid(a), [(40,)]),
    ("hardswish", lambda b, x: b.emit("hardswish", x), lambda a: F.hardswish(a), [(2, 7, 3)]),
    ("linear", lambda b, x: b.emit("linear", x), lambda *a: F.linear(*a), [(2, 7, 3), (5, 3), (5,)]),
    ("linear", lambda b, x: b.emit("linear", x), lambda *a: F.linear(*a), [(3,), (5, 3)]),
    ("layer_norm", lambda b, x: b.emit("layer_norm", x, normalized_ndim=1),
     lambda a, w, c: F.layer_norm(a, (3,), w, c), [(2, 7, 3), (3,), (3,)]),
    ("rms_norm", lambda b, x: b.emit("rms_norm", x, normalized_ndim=1, eps=1e-6),
     lambda a, w: F.rms_norm(a, (3,), w, 1e-6), [(2, 7, 3), (3,)]),
    ("scaled_dot_product_attention", lambda b, x: b.emit("scaled_dot_product_attention", x, is_causal=True),
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 4, 6, 8)] * 3),
    ("scaled_dot_product_attention", lambda b, x: b.emit("scaled_dot_product_attention", x),
     lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [(2, 4, 6, 8)] * 3 + [(6, 6)]),
    ("adaptive_avg_pool2d", lambda b, x: b.emit("adaptive_avg_pool2d", x, output_size=[3, 2]),
     lambda a: F.adaptive_avg_pool2d(a, (3, 2)), [(2, 3, 7, 5)]),
    ("adaptive_avg_pool2d", lambda b, x: b.emit("adaptive_avg_pool2d", x, output_size=[1, 1]),
     lambda a: F.adaptive_avg_pool2d(a, 1), [(2, 3, 7, 5)]),
    ("batch_norm", lambda b, x: b.emit("batch_norm", x, eps=1e-5),
     lambda a, w, c, m, v: F.batch_norm(a, m, v, w, c, eps=1e-5), [(2, 3, 4, 4), (3,), (3,), (3,), (3,)]),
]


def _run_case(build: Callable[[Builder, list[str]], object], shapes: list[tuple[int, ...]], arrays: list[np.ndarray]
              ) -> tuple[Graph, list[np.ndarray]]:
    g = Graph()
    b = Builder(g)
    xs = [g.add_input(f"x{i}", TensorSpec(s, "float32")) for i, s in enumerate(shapes)]
    out = build(b, xs)
    g.outputs = list(out) if isinstance(out, list) else [str(out)]
    verify(g)
    return g, interpret(g, arrays)


@pytest.mark.parametrize(("name", "build", "ref", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_composite_matches_torch(name: str, build: Callable, ref: Callable, shapes: list[tuple[int, ...]]) -> None:
    assert get_op(name).kind is OpKind.COMPOSITE
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if name == "batch_norm":
        arrays[4] = np.abs(arrays[4]) + 0.1  # a variance
    g, got = _run_case(build, shapes, arrays)
    want = ref(*[torch.from_numpy(a) for a in arrays])
    want_list = list(want) if isinstance(want, list | tuple) else [want]
    assert len(got) == len(want_list)
    for a, w in zip(got, want_list):
        assert a.shape == tuple(w.shape)
        np.testing.assert_allclose(a, w.numpy(), rtol=1e-5, atol=1e-6)
    lowered = DecomposePass().call(g.copy()).graph
    verify(lowered, allow_composite=False)
    assert all(get_op(n.op).kind is not OpKind.COMPOSITE for n in lowered.nodes)


def test_layout_ops_lower_to_single_raster() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 3, 4, 5), "float32"))
    g.outputs = [b.emit("transpose", [x], perm=[3, 1, 0, 2])]
    lowered = DecomposePass().call(g).graph
    assert lowered.op_counts() == {"raster": 1}


def test_identity_layout_ops_vanish() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 3), "float32"))
    y = b.emit("reshape", [x], shape=[2, 3])
    y = b.emit("slice", [y], starts=[0], ends=[10], axes=[1])
    g.outputs = [b.emit("relu", [y])]
    lowered = DecomposePass().call(g).graph
    assert lowered.op_counts() == {"maximum": 1}


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_reflect_and_edge_pads_are_three_regions_per_axis(mode: str) -> None:
    # A pad along a long axis (a pitch tracker's 43844 audio samples) must not cost a region per row.
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 5000, 3), "float32"))
    g.outputs = [b.emit("pad", [x], pads=[[0, 0], [700, 900], [1, 2]], mode=mode)]
    lowered = DecomposePass().call(g.copy()).graph
    assert [len(n.attrs["regions"]) for n in lowered.nodes] == [3, 3]
    a = np.random.default_rng(1).standard_normal((2, 5000, 3)).astype(np.float32)
    want = np.pad(a, [(0, 0), (700, 900), (1, 2)], mode=mode)
    np.testing.assert_array_equal(interpret(lowered, [a])[0], want)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_reflect_and_edge_pads_crop_with_a_negative_pad(mode: str) -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3, 7), "float32"))
    g.outputs = [b.emit("pad", [x], pads=[[-1, 2], [3, -2]], mode=mode)]
    a = np.arange(21, dtype=np.float32).reshape(3, 7)
    want = np.pad(a, [(0, 2), (3, 0)], mode=mode)[1:, :-2]  # reflected about the whole axis, then cropped
    np.testing.assert_array_equal(interpret(g, [a])[0], want)
