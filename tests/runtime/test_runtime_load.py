"""load() and LoadedProgram: results equal the interpreter's, inputs are checked, outputs are fresh copies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from runtime_testkit import chain_of_adds, f32, random_dag, random_inputs, small_cnn, small_transformer_block

from edgerun.backends.reference import bind_node
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import KERNELS, interpret
from edgerun.program import Program
from edgerun.runtime import EventRecorder, load


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("make", [small_cnn, small_transformer_block, lambda: chain_of_adds(50)],
                         ids=["cnn", "transformer", "chain"])
def test_load_runs_exactly_like_the_interpreter(make) -> None:  # type: ignore[no-untyped-def]
    graph = make()
    m = load(graph)
    for seed in range(2):  # a second call reuses the arena: stale bytes must not leak into results
        xs = random_inputs(graph, seed)
        assert_same(m.run(xs), interpret(graph, xs))


def test_random_graphs_match_the_interpreter() -> None:
    for seed in range(15):
        graph = random_dag(seed)
        xs = random_inputs(graph, seed)
        assert_same(load(graph).run(xs), interpret(graph, xs))


def test_call_by_position_or_name_single_and_multiple_outputs() -> None:
    cnn = small_cnn()
    m = load(cnn)
    x = random_inputs(cnn)[0]
    single = m(x)
    assert isinstance(single, np.ndarray)
    np.testing.assert_array_equal(single, m(image=x))
    block = small_transformer_block()
    pair = load(block)(random_inputs(block)[0])
    assert isinstance(pair, tuple) and len(pair) == 2


def test_outputs_are_fresh_copies_not_arena_views() -> None:
    graph = chain_of_adds(3)
    m = load(graph)
    first = m(np.zeros(4, np.float32))
    assert not np.shares_memory(first, m.parts.arena)
    m(np.ones(4, np.float32))
    np.testing.assert_array_equal(first, np.full(4, 0 + 1 + 2, np.float32))


def test_outputs_that_are_inputs_constants_or_reshapes_of_them() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", f32(2, 3))
    c = b.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    flat_c = b.emit("reshape", [c], shape=[6])
    flat_x = b.emit("reshape", [x], shape=[3, 2])
    g.outputs = [x, c, flat_c, flat_x, b.emit("add", [x, c]), x]
    m = load(g)
    xs = [np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)]
    assert_same(m.run(xs), interpret(g, xs))
    assert not any(i.op == "raster" for i in m.instructions)  # both reshapes were elided as aliases
    assert m.plan.aliases  # the reshape of x shares x's bytes


def test_input_errors_are_clear() -> None:
    m = load(small_cnn())
    x = random_inputs(small_cnn())[0]
    with pytest.raises(EdgerunError, match="takes 1 inputs"):
        m(x, x)
    with pytest.raises(EdgerunError, match="shape"):
        m(x[:1])
    with pytest.raises(EdgerunError, match="float32"):
        m(x.astype(np.complex64))
    with pytest.raises(EdgerunError, match=r"unknown inputs \['pixels'\]; the program takes \['image'\]"):
        m(pixels=x)
    with pytest.raises(EdgerunError, match="missing inputs"):
        m.run({})
    with pytest.raises(EdgerunError, match="not both"):
        m(x, image=x)
    with pytest.raises(EdgerunError, match="unknown inputs"):
        m.run({"image": x, "extra": x})
    np.testing.assert_array_equal(m(x.astype(np.float64)), m(x))  # a safe conversion is accepted


def test_exact_inputs_take_the_fast_path_and_everything_else_the_full_check() -> None:
    graph = small_cnn()
    m = load(graph)
    x = random_inputs(graph)[0]
    want = interpret(graph, [x])[0]
    strided = np.repeat(x, 2, axis=-1)[..., ::2]  # exact shape and dtype, not contiguous: still fast
    for value in (x, strided):
        assert m._exact_inputs((value,)) is not None and m._exact_inputs([value]) is not None
        np.testing.assert_array_equal(m(value), want)
    # Anything else goes through bind_inputs, which checks and converts: another byte order, float64, a
    # list, a mapping. Each must give the same result as the exact array.
    big_endian = x.astype(">f4")
    for value in (big_endian, x.astype(np.float64), x.tolist()):
        assert m._exact_inputs((value,)) is None
        np.testing.assert_array_equal(m(value), want)
    np.testing.assert_array_equal(m.run({"image": x})[0], want)
    with pytest.raises(EdgerunError, match="shape"):
        m(x[..., :-1])


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "mnn"])
def test_a_call_whose_later_input_leaves_the_fast_path_still_gets_every_input(backend: str) -> None:
    # The fast path checks and copies input by input; one that does not match (here the second) sends the
    # call to the full check, which must copy all of them again, not run on the first alone. On MNN the
    # program is one partition that takes the caller's arrays: the fast path hands them over uncopied.
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    if backend == "mnn":
        pytest.importorskip("MNN")
    g = Graph()
    b = Builder(g)
    x, y = g.add_input("x", f32(2, 3)), g.add_input("y", f32(2, 3))
    g.outputs = [b.binary("mul", x, b.binary("add", y, b.const(np.float32(1))))]
    m = load(g, [backend])
    rng = np.random.default_rng(2)
    a, c, a2 = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    np.testing.assert_array_equal(m(a, c), a * (c + 1))
    np.testing.assert_array_equal(m(a2, c.astype(np.float64)), a2 * (c + 1))
    with pytest.raises(EdgerunError, match="shape"):
        m(a, c[:1])
    np.testing.assert_array_equal(m([a, c][0], c), a * (c + 1))
    first = m.run([a, c])[0]
    first[...] = 0  # a returned array is the caller's: the next call is unaffected
    np.testing.assert_array_equal(m.run((a, c))[0], a * (c + 1))
    assert (m._direct is not None) == (backend == "mnn")
    a[...] = 5  # nor does the caller's input array stay tied to the program
    np.testing.assert_array_equal(first, 0)
    recorder = EventRecorder()  # a profiled call takes the arena path: the same answer
    np.testing.assert_array_equal(m.run([a, c], sink=recorder)[0], m.run([a, c])[0])
    assert len(recorder.events) == 1 if backend != "reference" else recorder.events


def test_profiling_sink_sees_every_instruction_in_order() -> None:
    graph = small_cnn()
    m = load(graph)
    recorder = EventRecorder()
    seen_conv: list[np.ndarray] = []

    def sink(event):  # type: ignore[no-untyped-def]
        recorder(event)
        if event.op == "conv2d":
            seen_conv.append(m.value(event.instruction.outputs[0]).copy())

    x = random_inputs(graph)[0]
    np.testing.assert_array_equal(m.run([x], sink=sink)[0], m(x))
    assert [e.index for e in recorder.events] == list(range(len(m.instructions)))
    assert all(e.end_ns >= e.start_ns and e.backend == "reference" for e in recorder.events)
    assert {e.node for e in recorder.events} == {i.node for i in m.instructions}
    intermediates: dict[str, np.ndarray] = {}
    interpret(graph, [x], hook=lambda node, _, outs: intermediates.update(zip(node.outputs, outs)))
    convs = [i.outputs[0] for i in m.instructions if i.op == "conv2d"]
    assert len(seen_conv) == len(convs) == 2
    for name, value in zip(convs, seen_conv):
        np.testing.assert_array_equal(value, intermediates[name])


def test_bound_fast_paths_compute_what_the_kernels_compute() -> None:
    rng = np.random.default_rng(3)
    for op in ("add", "sub", "mul", "div", "pow", "mod", "maximum", "minimum", "exp", "log", "sqrt", "rsqrt",
               "tanh", "sin", "cos", "floor", "ceil", "round", "neg", "abs", "sign", "reciprocal", "eq", "lt"):
        for dtype in (DType.float32, DType.int32):
            g = Graph()
            b = Builder(g)
            a = g.add_input("a", TensorSpec((3, 4), dtype))
            c = g.add_input("c", TensorSpec((4,), dtype))
            try:
                out = b.emit(op, [a, c]) if op in KERNELS and _is_binary(op) else b.emit(op, [a])
            except ValueError:
                continue  # a float-only op on int32
            node = g.nodes[0]
            arrays = {"a": (rng.standard_normal((3, 4)) * 3).astype(dtype.np),
                      "c": (rng.standard_normal(4) * 3 + 5).astype(dtype.np)}
            if dtype is DType.int32:
                arrays["c"] = np.abs(arrays["c"]) + 1
            want = [np.empty(g.specs[out].shape, g.specs[out].dtype.np)]
            got = {**arrays, out: np.empty_like(want[0])}
            with np.errstate(all="ignore"):
                KERNELS[op]([arrays[i] for i in node.inputs], node.attrs, want)
                bind_node(node, got)()
            np.testing.assert_array_equal(got[out], want[0], err_msg=f"{op} {dtype.value}")


def _is_binary(op: str) -> bool:
    from edgerun.ir.registry import get_op
    return get_op(op).max_inputs == 2


def test_program_file_round_trip_keeps_weights_mapped(tmp_path: Path) -> None:
    graph = small_cnn()
    path = tmp_path / "cnn.edgerun"
    Program(graph).save(path)
    m = load(path)
    x = random_inputs(graph)[0]
    np.testing.assert_array_equal(m(x), interpret(graph, [x])[0])
    assert m.program is not None
    consts = [m.parts.views[k] for k in m.program.graph.constants if k in m.parts.views]
    assert consts and not any(c.flags.writeable for c in consts)  # the file's mapped bytes, never copied
    assert all(m.parts.views[k] is m.program.graph.constants[k] for k in m.program.graph.constants
               if k in m.parts.views)
    assert not any(np.shares_memory(c, m.parts.arena) for c in consts)


def test_runtime_needs_no_torch(tmp_path: Path) -> None:
    path = tmp_path / "block.edgerun"
    graph = small_transformer_block()
    Program(graph).save(path)
    x = random_inputs(graph)[0]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", interpret(graph, [x])[0])
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        import numpy as np
        import edgerun.runtime as rt
        m = rt.load({str(path)!r})
        out = m(np.load({str(tmp_path / 'x.npy')!r}))[0]
        np.testing.assert_array_equal(out, np.load({str(tmp_path / 'want.npy')!r}))
        assert "torch" not in [k for k, v in sys.modules.items() if v is not None]
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_an_input_converted_to_the_programs_dtype_keeps_its_values_or_is_refused() -> None:
    # int64 ids into an int32 input and float64 into float32 are converted (numpy's defaults); a value the
    # conversion would wrap or turn into infinity is refused, naming the input, instead of run silently.
    g = Graph()
    b = Builder(g)
    ids = g.add_input("ids", TensorSpec((3,), DType.int32))
    half = g.add_input("half", TensorSpec((3,), DType.float16))
    g.outputs = [b.emit("add", [ids, ids]), b.emit("add", [half, half])]
    m = load(g)
    twice, doubled = m(ids=np.array([1, -2, 70000], np.int64), half=np.array([0.5, -1.0, np.inf]))
    assert twice.dtype == np.int32 and twice.tolist() == [2, -4, 140000]
    assert doubled.dtype == np.float16 and doubled.tolist() == [1.0, -2.0, np.inf]  # an infinity passed stays one
    with pytest.raises(EdgerunError, match=r"input 'ids' holds 4294967296, outside int32's range"):
        m(ids=np.array([1, 2**32, 3], np.int64), half=np.zeros(3))
    with pytest.raises(EdgerunError, match=r"input 'ids' holds -2147483649"):
        m(ids=np.array([-(2**31) - 1, 0, 0], np.int64), half=np.zeros(3))
    with pytest.raises(EdgerunError, match=r"input 'half' holds -70000.0, beyond float16's largest value"):
        m(ids=np.zeros(3, np.int64), half=np.array([1.0, -70000.0, 2.0]))
    with pytest.raises(EdgerunError, match=r"input 'ids' must be int32, got float64"):
        m(ids=np.zeros(3), half=np.zeros(3))
