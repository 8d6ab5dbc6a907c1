"""Constants a backend keeps in its own form, released from the host (runtime/constant_release.py): ONNX
Runtime's MatMulNBits prepacks its 4-bit codes and its float MatMul a constant right-hand side, so the
program's array can go once no other partition reads it; the runs give the same answers after, and the
program refuses to be saved."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.backends.onnxruntime import _probe_session, make_session
from edgerun.backends.onnxruntime.onnx_prepacked import released_initializers, shared_initializers
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.quant_kernels import pack_int4
from edgerun.program import Program
from edgerun.runtime import load
from edgerun.runtime.constant_release import release_constants

K, N, GROUP = 576, 256, 32


def int4_graph(also_on_reference: bool = False, activations: str = "int8") -> tuple[Graph, str, str]:
    """y = x @ W (matmul_int4, codes and scales large enough to be handed to ORT as shared arrays);
    with `also_on_reference`, a second output sums the codes with a node forced onto the reference.
    `activations="int8"` is MatMulNBits at accuracy level 4 (scales folded into the packed layout), "float"
    level 0 (scales read on every call)."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((1, K), DType.float32))
    codes = g.add_constant(pack_int4(rng.integers(0, 16, (N, K // GROUP, GROUP)).astype(np.uint8)), name="codes")
    scales = g.add_constant((rng.random((N, K // GROUP)) * 0.1 + 0.01).astype(np.float32), name="scales")
    attrs = {"activations": "int8"} if activations == "int8" else {}
    g.outputs = [b.emit("matmul_int4", [x, codes, scales], k=K, n=N, group_size=GROUP, **attrs)]
    if also_on_reference:
        g.outputs.append(b.emit("reduce_sum", [b.emit("cast", [codes], dtype="float32")], axes=[0, 1, 2],
                                keepdims=False))
    return g, codes, scales


@pytest.mark.parametrize("activations", ["int8", "float"])
def test_onnxruntime_releases_the_codes_it_prepacked_and_runs_the_same(activations: str) -> None:
    """At accuracy level 4 (int8 activations) MatMulNBits folds the scales into its packed layout, so their
    array goes too (the session reads a flattened view of it: the view's constant is released); at level 0
    it reads them on every call, so they stay."""
    graph, codes, scales = int4_graph(activations=activations)
    program = Program(graph)
    loaded = load(program, backends=["onnxruntime"])
    (compiled,) = loaded.parts.compiled
    gone = {codes, scales} if activations == "int8" else {codes}
    assert compiled.backend == "onnxruntime" and compiled.released_constants == gone
    x = np.random.default_rng(1).standard_normal((1, K)).astype(np.float32)
    before = loaded(x)
    nbytes = sum(graph.constants[name].nbytes for name in gone)
    assert release_constants(loaded) == nbytes
    assert program.released == gone
    for array in (program.graph.constants[codes], loaded.parts.views[codes], compiled.graph.constants[codes]):
        assert array.shape == (N, K // GROUP, GROUP // 2) and not any(array.strides) and not array.any()
    assert program.graph.constants[scales].any() == (activations == "float")
    np.testing.assert_array_equal(loaded(x), before)
    with pytest.raises(EdgerunError, match="released"):
        program.to_bytes()
    assert release_constants(loaded) == 0  # nothing left to release


def test_a_constant_another_partition_reads_is_kept() -> None:
    """The codes are read by a reference partition too, so they stay; the scales only ORT read (and packed,
    at accuracy level 4), so they go."""
    graph, codes, scales = int4_graph(also_on_reference=True)
    program = Program(graph)
    placement = {n.name: "reference" for n in graph.nodes if n.op != "matmul_int4"}
    loaded = load(program, backends=["onnxruntime"], placement=placement)
    assert {c.backend for c in loaded.parts.compiled} == {"onnxruntime", "reference"}
    assert any(codes in c.released_constants for c in loaded.parts.compiled)  # ORT's partition would
    x = np.ones((1, K), np.float32)
    before = loaded(x)
    assert release_constants(loaded) == graph.constants[scales].nbytes and program.released == {scales}
    np.testing.assert_array_equal(loaded(x)[1], before[1])
    np.testing.assert_array_equal(loaded(x)[0], before[0])


@pytest.mark.parametrize("activations", ["int8", "float"])
def test_only_a_prepacked_input_slot_is_released(activations: str) -> None:
    """The scales of MatMulNBits are read at run time on ORT's float path (accuracy level 0): shared, but
    never released; at level 4 they are packed with the codes, and released too."""
    from edgerun.backends.onnxruntime import build_model

    graph, codes, _ = int4_graph(activations=activations)
    model, external = build_model(graph)
    (scales,) = set(external) - {codes}  # MatMulNBits' flat view of the scales
    session = make_session(model, external, 1)
    assert shared_initializers(session) == {codes, scales}
    want = {codes, scales} if activations == "int8" else {codes}
    assert released_initializers(model, shared_initializers(session), _probe_session) == want


@pytest.mark.parametrize("zero_points, released", [(np.uint8, {"codes"}), (np.float32, set())])
def test_float_zero_points_keep_the_codes(zero_points: type, released: set[str]) -> None:
    """ORT does not prepack MatMulNBits with float zero points, so its codes are read at run time."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMulNBits", ["a", "codes", "scales", "zp"], ["y"], domain="com.microsoft", K=64, N=8,
                            bits=4, block_size=32, accuracy_level=4)
    zp = numpy_helper.from_array(np.full(8 if zero_points is np.uint8 else 16, 8, zero_points), "zp")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [zp])
    assert released_initializers(helper.make_model(graph), {"codes"}, _probe_session) == released


def test_a_float_matmul_constant_onnxruntime_prepacked_is_released() -> None:
    """MLAS packs a constant float right-hand side when the session is built; its host array is released and
    the partition answers the same. A constant left-hand side is not a prepacked slot, so it stays."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3, 128), DType.float32))
    w = g.add_constant(rng.standard_normal((128, 640)).astype(np.float32), name="w")
    left = g.add_constant(rng.standard_normal((100, 3)).astype(np.float32), name="left")  # shared, not packed
    g.outputs = [b.emit("matmul", [left, b.emit("matmul", [x, w])])]
    program = Program(g)
    loaded = load(program, backends=["onnxruntime"])
    (compiled,) = loaded.parts.compiled
    assert {w, left} <= shared_initializers(compiled.run.__self__.session) and compiled.released_constants == {w}
    xv = rng.standard_normal((3, 128)).astype(np.float32)
    before = loaded(xv)
    np.testing.assert_allclose(before, g.constants[left] @ (xv @ g.constants[w]), rtol=1e-4, atol=1e-4)
    assert release_constants(loaded) == 128 * 640 * 4 and program.released == {w}
    np.testing.assert_array_equal(loaded(xv), before)


@pytest.mark.parametrize("rows", [1, 16])
def test_a_float_matmul_constant_of_few_rows_is_read_in_place(rows: int) -> None:
    """A constant right-hand side with a short contraction (an LLM's Q4_1 offset matrix, [18, N]) is bound to
    the program's array at run time instead of prepacked by each session: ORT neither copies nor packs it,
    so the host keeps it (nothing to release) and a change to the array is seen by the next run."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((rows, 18), DType.float32))
    w = g.add_constant(rng.standard_normal((18, 960)).astype(np.float32), name="w")
    g.outputs = [b.emit("matmul", [x, w])]
    program = Program(g)
    loaded = load(program, backends=["onnxruntime"])
    (compiled,) = loaded.parts.compiled
    assert compiled.info["constants_read_in_place"] == 1 and not compiled.released_constants
    assert w not in shared_initializers(compiled.run.__self__.session)
    xv = rng.standard_normal((rows, 18)).astype(np.float32)
    np.testing.assert_allclose(loaded(xv), xv @ g.constants[w], rtol=1e-4, atol=1e-4)
    assert release_constants(loaded) == 0
    want = 2 * (xv @ g.constants[w])
    loaded.parts.views[w][...] *= 2  # the bound array itself (a test only: constants are read-only by contract)
    np.testing.assert_allclose(loaded(xv), want, rtol=1e-4, atol=1e-4)
