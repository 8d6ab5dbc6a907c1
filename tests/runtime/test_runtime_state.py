"""Program state at run time: persistent buffers bound as views, updates written back (or in place), shared
by every method of one load, reset and inspected by name; on the reference, ONNX Runtime and "auto"."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import edgerun
from edgerun.errors import EdgerunError, VerificationError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.program import Program
from edgerun.runtime.state import StateStore

F32 = DType.float32
SPEC = TensorSpec((2, 3), F32)
BACKENDS = [None, "onnxruntime", "auto"]


def accumulator() -> Graph:
    """acc' = acc + 2x; returns acc' + 0.5."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", SPEC)
    g.specs["acc"] = SPEC
    g.state_inputs.append("acc")
    w = g.add_constant(np.full((2, 3), 2, np.float32), name="w")
    new = b.binary("add", "acc", b.binary("mul", x, w))
    g.outputs = [b.binary("add", new, b.const(np.float32(0.5)))]
    g.state_updates["acc"] = new
    return g


def peek() -> Graph:
    """(acc + y) * w, reading the state the other method writes; shares the constant w by name."""
    g = Graph()
    b = Builder(g)
    y = g.add_input("y", SPEC)
    g.specs["acc"] = SPEC
    g.state_inputs.append("acc")
    g.add_constant(np.full((2, 3), 2, np.float32), name="w")
    g.outputs = [b.binary("mul", b.binary("add", "acc", y), "w")]
    return g


def two_method_program() -> Program:
    return Program.from_methods({"forward": accumulator(), "peek": peek()},
                                state={"acc": np.zeros((2, 3), np.float32)})


@pytest.mark.parametrize("backends", BACKENDS)
def test_state_persists_across_calls_and_methods_and_resets(tmp_path, backends):
    path = tmp_path / "acc.edgerun"
    two_method_program().save(path)
    model = edgerun.load(path, backends=backends)
    assert model.methods == ["forward", "peek"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for calls in range(1, 4):
        out = model(x)
        np.testing.assert_allclose(out, 2 * calls * x + 0.5)
        np.testing.assert_allclose(model.state["acc"], 2 * calls * x)
    ones = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(model.peek(ones), (6 * x + 1) * 2)  # the other method reads the same buffer
    np.testing.assert_allclose(model.run_method("peek", y=ones), (6 * x + 1) * 2)
    model.reset_state()
    np.testing.assert_allclose(model.state["acc"], 0)
    np.testing.assert_allclose(model(x), 2 * x + 0.5)


def test_state_views_are_read_only_and_set_state_checks():
    model = edgerun.load(two_method_program())
    with pytest.raises(ValueError):
        model.state["acc"][...] = 1
    model.set_state(acc=np.full((2, 3), 3, np.float32))
    np.testing.assert_allclose(model(np.zeros((2, 3), np.float32)), 3.5)
    with pytest.raises(EdgerunError, match="state 'acc' is float32"):
        model.set_state(acc=np.zeros((3, 2), np.float32))
    with pytest.raises(EdgerunError, match="unknown state"):
        model.set_state(other=np.zeros(1))


def test_unknown_method_is_a_clear_error():
    model = edgerun.load(two_method_program())
    with pytest.raises(EdgerunError, match=r"no method 'decode'.*forward"):
        model.run_method("decode", np.zeros((2, 3), np.float32))
    with pytest.raises(AttributeError, match="its methods are"):
        model.decode  # noqa: B018


def test_update_written_after_last_read_is_planned_in_place():
    """acc' = tanh(acc) + x: the last read of acc comes before the update is written, so the kernels write
    straight into the state buffer (nothing to copy after the call); acc' = acc + x cannot be."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", SPEC)
    g.specs["acc"] = SPEC
    g.state_inputs.append("acc")
    new = b.binary("add", b.unary("tanh", "acc"), x)
    g.outputs = [b.unary("neg", new)]
    g.state_updates["acc"] = new
    model = edgerun.load(Program(g, state={"acc": np.zeros((2, 3), np.float32)}))
    assert model.parts.state is not None
    assert model.parts.state.plan.in_place == ("acc",) and model.parts.state.plan.copies == ()
    acc = np.zeros((2, 3), np.float32)
    for k in range(3):
        xk = np.full((2, 3), k, np.float32)
        acc = np.tanh(acc) + xk
        np.testing.assert_allclose(model(xk), -acc, rtol=1e-6)
    np.testing.assert_allclose(model.state["acc"], acc, rtol=1e-6)
    copied = edgerun.load(two_method_program())
    assert copied.parts.state is not None and copied.parts.state.plan.copies and not copied.parts.state.plan.in_place


def test_swapped_states_and_an_output_of_the_old_state():
    """a' = b, b' = a, and the call returns the old a: every read sees the values from before the call."""
    g = Graph()
    g.specs["a"] = g.specs["b"] = SPEC
    g.state_inputs += ["a", "b"]
    g.outputs = ["a"]
    g.state_updates.update(a="b", b="a")
    verify(g)
    a0, b0 = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    for backends in BACKENDS:
        model = edgerun.load(Program(g, state={"a": a0, "b": b0}), backends=backends)
        np.testing.assert_array_equal(model(), a0)
        np.testing.assert_array_equal(model.state["a"], b0)
        np.testing.assert_array_equal(model.state["b"], a0)
        np.testing.assert_array_equal(model(), b0)


def test_a_stateful_graph_alone_cannot_be_loaded():
    with pytest.raises(EdgerunError, match="load the Program"):
        edgerun.load(accumulator())


def test_verifier_checks_state():
    g = accumulator()
    g.state_updates["acc"] = "x_missing"
    with pytest.raises(VerificationError, match="never defined"):
        verify(g)
    g = accumulator()
    wide = g.add_constant(np.zeros((3, 3), np.float32), name="wide")
    g.state_updates["acc"] = wide
    with pytest.raises(VerificationError, match="update of state 'acc' is float32"):
        verify(g)
    g = accumulator()
    g.state_inputs.append("x")
    with pytest.raises(VerificationError, match="also a graph input"):
        verify(g)
    with pytest.raises(VerificationError, match="reads state 'acc' as float32\\[2,3\\], the state is float32\\[4\\]"):
        Program.from_methods({"forward": accumulator()}, state={"acc": np.zeros(4, np.float32)})
    with pytest.raises(VerificationError, match="program does not have"):
        Program.from_methods({"forward": accumulator()})


def rss_anon_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_zero_broadcast_state_is_resident_only_where_written():
    """A state whose initial value is one broadcast zero (an LLM's KV cache) takes fresh pages: loading it
    touches none of its 64 MB, a write makes only its own pages resident, reset gives them back as zeros."""
    shape = (16, 1024, 1024)
    before = rss_anon_mb()
    store = StateStore({"cache": np.broadcast_to(np.zeros((), np.float32), shape)})
    buffer = store.buffers["cache"]
    assert buffer.shape == shape and buffer.dtype == np.float32 and buffer.flags.writeable
    assert rss_anon_mb() - before < 16
    buffer[3, :16] = 7  # 64 KB
    assert rss_anon_mb() - before < 16 and buffer[3, :16].min() == 7 and not buffer[4].any()
    store.reset()
    assert not buffer.any() and rss_anon_mb() - before < 16
    plain = StateStore({"acc": np.ones((2, 3), np.float32)})  # any other initial value is copied in
    plain.buffers["acc"][...] = 5
    plain.reset()
    np.testing.assert_array_equal(plain.buffers["acc"], 1)


def test_a_zero_broadcast_state_persists_and_resets_through_a_loaded_program():
    zero = np.broadcast_to(np.zeros((), np.float32), (2, 3))
    model = edgerun.load(Program.from_methods({"forward": accumulator(), "peek": peek()}, state={"acc": zero}))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model(x)
    np.testing.assert_allclose(model(x), 4 * x + 0.5)
    model.reset_state()
    np.testing.assert_allclose(model.state["acc"], 0)
    np.testing.assert_allclose(model(x), 2 * x + 0.5)
