"""Partitions that are one graph at different sizes share one ONNX Runtime session (onnx_shape_variants.py).

The program here is an LLM step in miniature: a stacked projection split in two (a raster slice), a reshape
to a T-dependent shape, and a clamp against a T-dependent integer constant, built at T = 4 (a chunk) and
T = 1 (a step), over the same weight array. Each method must give what the reference gives, and the two
must run on one session, whose model has symbolic sizes.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import edgerun
from edgerun.backends.onnxruntime import create_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program

CONTEXT = 16


def step(T: int, weight: np.ndarray) -> Graph:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((T, 8), DType.float32))
    start = g.add_input("start", TensorSpec((1,), DType.int64))
    w = g.add_constant(weight, name="w")
    y = b.emit("matmul", [x, w])  # [T, 32]
    gate = b.emit("slice", [y], starts=[0], ends=[16], axes=[1])
    up = b.emit("slice", [y], starts=[16], ends=[32], axes=[1])
    z = b.binary("mul", b.emit("relu", [gate]), up)
    rows = b.emit("reduce_sum", [b.emit("reshape", [z], shape=[T, 4, 4])], axes=[2])  # [T, 4]
    # The last start a chunk of T rows may write at: C - T (a differing constant that no -1 can stand for).
    clamped = b.binary("minimum", start, b.const(np.asarray([CONTEXT - T], np.int64)))
    g.outputs = [rows, clamped]
    return g


def two_lengths(weight: np.ndarray, weight_step: np.ndarray | None = None) -> Program:
    return Program.from_methods({"chunk": step(4, weight), "step": step(1, weight if weight_step is None
                                                                          else weight_step)},
                                default_method="chunk")


def weight(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((8, 32)).astype(np.float32)


def only_partition(loaded: Any, method: str) -> Any:
    (compiled,) = loaded.method(method).parts.compiled
    assert compiled.backend == "onnxruntime"
    return compiled


def run_both(loaded: Any, start: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(1)
    starts = np.asarray([start], np.int64)
    return {"chunk": loaded.method("chunk").run({"x": rng.standard_normal((4, 8)).astype(np.float32),
                                                 "start": starts}),
            "step": loaded.method("step").run({"x": rng.standard_normal((1, 8)).astype(np.float32),
                                               "start": starts})}


def test_one_graph_at_two_lengths_runs_on_one_session_and_gives_the_references_results() -> None:
    program = two_lengths(weight(10))
    loaded = edgerun.load(program, backends=["onnxruntime"])
    chunk, one = only_partition(loaded, "chunk"), only_partition(loaded, "step")
    assert chunk.run.__self__.session is one.run.__self__.session
    assert (chunk.info["session_shared_by"], one.info["session_shared_by"]) == (1, 2)
    session = one.run.__self__.session
    sizes = {i.name: i.shape for i in session.get_inputs()}
    assert isinstance(sizes["x"][0], str) and sizes["x"][1] == 8  # the length is symbolic, the width not
    # The reshape's T became -1; the clamp's C - T is chosen at run time between 12 and 15.
    from onnx import numpy_helper

    model = one.run.__self__.model
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_location != t.EXTERNAL}
    (reshape,) = [n for n in model.graph.node if n.op_type == "Reshape"]
    assert values[reshape.input[1]].tolist() == [-1, 4, 4]
    (where,) = [n for n in model.graph.node if n.op_type == "Where"]
    assert sorted(int(values[v][0]) for v in where.input[1:]) == [CONTEXT - 4, CONTEXT - 1]
    reference = edgerun.load(program, backends=["reference"])
    for start in (3, 14):  # below and above both clamps (12 for the chunk, 15 for the step)
        got, want = run_both(loaded, start), run_both(reference, start)
        for method in ("chunk", "step"):
            np.testing.assert_allclose(got[method][0], want[method][0], rtol=1e-5, atol=1e-5)
            assert got[method][1].tolist() == want[method][1].tolist() == [min(start, CONTEXT - (4 if method == "chunk" else 1))]


def test_the_generic_session_computes_what_each_lengths_own_session_does() -> None:
    """Each method compiled alone, by a backend that has seen nothing else, runs a static session of its own
    graph: the shared generic session must agree with it exactly."""
    program = two_lengths(weight(11))
    loaded = edgerun.load(program, backends=["onnxruntime"])
    rng = np.random.default_rng(2)
    for method, T in (("chunk", 4), ("step", 1)):
        shared = only_partition(loaded, method)
        alone = create_backend().compile(shared.graph)
        assert alone.info["session_shared_by"] == 1
        inputs = [rng.standard_normal((T, 8)).astype(np.float32) if name == "x" else np.asarray([9], np.int64)
                  for name in shared.graph.inputs]
        for a, b in zip(shared(*inputs), alone(*inputs)):
            np.testing.assert_array_equal(a, b)


def test_lengths_tuned_to_spin_differently_share_one_session_that_spins() -> None:
    """The search tunes pool-thread spinning per method (an LLM's decode spins, its prefill not): the two must
    still share one session (one prepacked copy of the weights), and it spins, as the faster setting did."""
    loaded = edgerun.load(two_lengths(weight(16)), backends=["onnxruntime"])
    chunk_graph, step_graph = only_partition(loaded, "chunk").graph, only_partition(loaded, "step").graph
    backend = create_backend(threads=1, spin=False)
    chunk = backend.compile(chunk_graph)
    backend.spin = True  # what apply_settings({"spin": True}) does on the copy the search loads with
    one = backend.compile(step_graph)
    session = one.run.__self__.session
    assert chunk.run.__self__.session is session and one.info["session_shared_by"] == 2
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"
    # The same graph compiled again with the other setting (the search timing a spin change) is not handed
    # the session it is being compared with: it gets its own, with its own setting.
    backend.spin = False
    trial_step = backend.compile(step_graph)
    trial = trial_step.run.__self__.session
    assert trial is not session
    assert trial.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # ... and the trial's other length shares the trial's session (one more prepacked copy, not two).
    trial_chunk = backend.compile(chunk_graph)
    assert trial_chunk.run.__self__.session is trial_step.run.__self__.session is not session
    rng = np.random.default_rng(3)
    for compiled, T in ((chunk, 4), (one, 1)):
        inputs = [rng.standard_normal((T, 8)).astype(np.float32) if name == "x" else np.asarray([9], np.int64)
                  for name in compiled.graph.inputs]
        for a, b in zip(compiled(*inputs), create_backend(threads=1).compile(compiled.graph)(*inputs)):
            np.testing.assert_array_equal(a, b)


def test_methods_over_different_weights_keep_sessions_of_their_own() -> None:
    loaded = edgerun.load(two_lengths(weight(12), weight(13)), backends=["onnxruntime"])
    chunk, one = only_partition(loaded, "chunk"), only_partition(loaded, "step")
    assert chunk.run.__self__.session is not one.run.__self__.session
    assert chunk.info["session_shared_by"] == one.info["session_shared_by"] == 1


def test_the_same_graph_loaded_again_reuses_the_live_session_and_a_freed_one_is_forgotten() -> None:
    """A second load of one program reads the very same weight arrays, so it takes the live session; once
    that is freed, a new program (new arrays) builds its own."""
    gc.collect()  # earlier tests' programs, if still in cycles
    program = Program.from_methods({"chunk": step(4, weight(14))}, default_method="chunk")
    first = edgerun.load(program, backends=["onnxruntime"])
    again = edgerun.load(program, backends=["onnxruntime"])
    session = only_partition(first, "chunk").run.__self__.session
    assert only_partition(again, "chunk").run.__self__.session is session
    assert only_partition(again, "chunk").info["session_shared_by"] == 2
    x = {"x": np.ones((4, 8), np.float32), "start": np.asarray([0], np.int64)}
    np.testing.assert_array_equal(first.run(x)[0], again.run(x)[0])
    del first, again, session
    gc.collect()
    fresh = edgerun.load(Program.from_methods({"chunk": step(4, weight(14))}, default_method="chunk"),
                         backends=["onnxruntime"])
    assert only_partition(fresh, "chunk").info["session_shared_by"] == 1


@pytest.mark.parametrize("T", [1, 3])
def test_a_split_reads_as_one_slice_of_its_source_at_any_length(T: int) -> None:
    """The raster emitter reads a one-region slice in its source's own shape, so the split's ONNX nodes do
    not depend on T (at T = 1 the region's axes merge; read as boxes it became a flat slice of a [-1] view)."""
    from edgerun.backends.onnxruntime import build_model

    loaded = edgerun.load(Program.from_methods({"m": step(T, weight(15))}, default_method="m"),
                          backends=["onnxruntime"])
    model, _ = build_model(only_partition(loaded, "m").graph)
    slices = [n for n in model.graph.node if n.op_type == "Slice"]
    assert len(slices) == 2 and not any(n.op_type == "Reshape" and n.output[0] in {s.input[0] for s in slices}
                                        for n in model.graph.node)


def test_a_runner_keeps_running_correctly_while_a_new_length_rebuilds_its_session() -> None:
    """A template's new shape may load in one thread while another runs a cached shape on the session being
    replaced: calls bound before the swap finish on the old session, later ones bind to the new one, and
    every result stays right."""
    import threading

    gc.collect()
    w = weight(16)
    first = edgerun.load(Program.from_methods({"chunk": step(4, w)}, default_method="chunk"), backends=["onnxruntime"])
    runner = only_partition(first, "chunk").run.__self__
    old = runner.session
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    want = edgerun.load(Program.from_methods({"chunk": step(4, w)}, default_method="chunk"),
                        backends=["reference"]).run({"x": x, "start": np.asarray([2], np.int64)})[0]
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_running() -> None:
        try:
            while not stop.is_set():
                got = first.run({"x": x, "start": np.asarray([2], np.int64)})[0]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        except BaseException as exc:  # reported to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=keep_running)
    thread.start()
    try:
        second = edgerun.load(Program.from_methods({"pair": step(2, w)}, default_method="pair"),
                              backends=["onnxruntime"])
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]
    assert runner.session is only_partition(second, "pair").run.__self__.session is not old
    assert only_partition(second, "pair").info["session_shared_by"] == 2
    np.testing.assert_allclose(first.run({"x": x, "start": np.asarray([2], np.int64)})[0], want, rtol=1e-5, atol=1e-5)


def test_a_forked_child_builds_its_own_session() -> None:
    """A forked child (a fleet agent, a stream worker) inherits the parent's sessions but not their thread
    pools: loading the same program there must not take the parent's session (a pooled run on it would wait
    for threads that do not exist), so the child's load builds its own, and runs."""
    import os
    import time

    gc.collect()
    rng = np.random.default_rng(17)
    g = Graph()
    x = g.add_input("x", TensorSpec((64, 256), DType.float32))
    w = g.add_constant(rng.standard_normal((256, 256)).astype(np.float32), name="w")
    g.outputs = [Builder(g).emit("matmul", [x, w])]  # 8 MFLOP: a pooled session
    program = Program.from_methods({"m": g}, default_method="m")
    parent = edgerun.load(program, backends=["onnxruntime"])
    assert only_partition(parent, "m").info["threads"] > 1
    xv = rng.standard_normal((64, 256)).astype(np.float32)
    want = xv @ g.constants[w]
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its own session ran and answered right
        code = 1
        try:
            child = edgerun.load(program, backends=["onnxruntime"])
            compiled = only_partition(child, "m")
            ok = compiled.info["session_shared_by"] == 1 and np.allclose(child.run({"x": xv})[0], want, atol=1e-3)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's load or run hung")
    np.testing.assert_allclose(parent.run({"x": xv})[0], want, atol=1e-3)
