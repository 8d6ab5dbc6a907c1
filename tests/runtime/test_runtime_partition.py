"""The partitioner, forced placements across two real backends, compile fallback, and the backend registry."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_testkit import (
    ELEMENTWISE,
    BrokenBackend,
    InterpreterBackend,
    f32,
    random_dag,
    random_inputs,
    small_cnn,
    small_transformer_block,
)

from edgerun.backends.registry import get_backend, register_backend, unregister_backend
from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.oracle import interpret
from edgerun.runtime import check_acyclic, load, partition_graph
from edgerun.runtime.loader import prepare_graph


@pytest.fixture
def interp() -> Iterator[InterpreterBackend]:
    backend = InterpreterBackend("interp_test")
    register_backend(backend.name, lambda: backend, replace=True)
    yield backend
    unregister_backend(backend.name)


def diamond(backends: str) -> tuple[Graph, dict[str, str]]:
    """a -> (b, c) -> d, each node on the backend named by one letter of `backends` (R or X)."""
    g = Graph()
    bld = Builder(g)
    x = g.add_input("x", f32(4))
    a = bld.emit("exp", [x])
    b = bld.emit("neg", [a])
    c = bld.emit("abs", [a])
    d = bld.emit("add", [b, c])
    g.outputs = [d]
    names = {"R": "reference", "X": "other"}
    return g, {n.name: names[k] for n, k in zip(g.nodes, backends)}


def test_diamond_with_a_foreign_branch_cannot_close_into_one_partition() -> None:
    g, assignment = diamond("RXRR")  # a, c, d on R; b on X: {a, c, d} would need X both before and after
    parts = partition_graph(g, assignment)
    check_acyclic(parts, g)
    assert [p.backend for p in parts] == ["reference", "other", "reference"]
    assert [len(p.nodes) for p in parts] == [2, 1, 1]


def test_diamond_on_one_backend_is_one_partition() -> None:
    g, assignment = diamond("RRRR")
    parts = partition_graph(g, assignment)
    assert len(parts) == 1 and len(parts[0].nodes) == 4
    assert parts[0].inputs == ["x"] and parts[0].outputs == g.outputs


def test_parallel_branches_merge_when_no_path_leaves_and_returns() -> None:
    g, assignment = diamond("XRRX")  # b and c are independent R nodes: one R partition between two X ones
    parts = partition_graph(g, assignment)
    check_acyclic(parts, g)
    assert [(p.backend, len(p.nodes)) for p in parts] == [("other", 1), ("reference", 2), ("other", 1)]


def test_long_path_through_another_backend_blocks_a_merge() -> None:
    # a(R) -> b(X) -> c(X) -> d(R), plus a -> d directly: d cannot join a's partition.
    g = Graph()
    bld = Builder(g)
    x = g.add_input("x", f32(4))
    a = bld.emit("exp", [x])
    c = bld.emit("neg", [bld.emit("abs", [a])])
    g.outputs = [bld.emit("add", [a, c])]
    assignment = dict(zip((n.name for n in g.nodes), ["reference", "other", "other", "reference"]))
    parts = partition_graph(g, assignment)
    check_acyclic(parts, g)
    assert len(parts) == 3


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.sampled_from([2, 3]))
def test_random_assignments_never_create_cycles_and_merge_neighbours(seed: int, n_backends: int) -> None:
    g = prepare_graph(random_dag(seed, nodes=25))
    r = random.Random(seed)
    assignment = {n.name: f"b{r.randrange(n_backends)}" for n in g.nodes}
    parts = partition_graph(g, assignment)
    check_acyclic(parts, g)
    for p in parts:
        assert all(assignment[n.name] == p.backend for n in p.nodes)
    # Maximality along edges: a node's producer on the same backend in another partition means merging
    # them would have closed a cycle, i.e. some third partition sits between them.
    part_of = {o: p.index for p in parts for n in p.nodes for o in n.outputs}
    for p in parts:
        for n in p.nodes:
            for i in n.inputs:
                q = part_of.get(i)
                if q is not None and q != p.index and parts[q].backend == p.backend:
                    assert _reachable_via_other(parts, part_of, q, p.index)


def _reachable_via_other(parts, part_of, src: int, dst: int) -> bool:  # type: ignore[no-untyped-def]
    succ: dict[int, set[int]] = {p.index: set() for p in parts}
    for p in parts:
        for n in p.nodes:
            for i in n.inputs:
                if i in part_of and part_of[i] != p.index:
                    succ[part_of[i]].add(p.index)
    stack = [s for s in succ[src] if s != dst]
    seen = set(stack)
    while stack:
        x = stack.pop()
        if x == dst:
            return True
        for s in succ[x] - seen:
            seen.add(s)
            stack.append(s)
    return False


def test_all_reference_placement_is_one_partition() -> None:
    m = load(small_cnn(), placement=None)
    assert len(m.partitions) == 1 and m.partitions[0].backend == "reference"


@pytest.mark.parametrize("make", [small_cnn, small_transformer_block], ids=["cnn", "transformer"])
def test_alternating_forced_placement_matches_the_interpreter(make, interp: InterpreterBackend) -> None:  # type: ignore[no-untyped-def]
    graph = make()
    nodes = prepare_graph(graph).nodes
    placement = {n.name: (interp.name if k % 2 else "reference") for k, n in enumerate(nodes)}
    m = load(graph, placement=placement)
    used = {n.name: p.backend for p in m.partitions for n in p.nodes}
    assert used == placement
    assert len(m.partitions) > 4 and interp.compiled > 0
    xs = random_inputs(graph)
    for got, want in zip(m.run(xs), interpret(graph, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # Values crossing partitions live in the planned arena; delegate internals do not.
    crossing = {v for p in m.partitions if p.backend == interp.name for v in p.inputs + p.outputs}
    assert crossing and crossing <= set(m.plan.values)


def test_preference_list_uses_supports(interp: InterpreterBackend) -> None:
    picky = InterpreterBackend("picky_test", ops=ELEMENTWISE)
    register_backend(picky.name, lambda: picky, replace=True)
    try:
        graph = small_cnn()
        m = load(graph, backends=[picky.name, "reference"])
        backends = {p.backend for p in m.partitions}
        assert backends == {picky.name, "reference"}
        for p in m.partitions:
            if p.backend == picky.name:
                assert all(n.op in ELEMENTWISE for n in p.nodes)
        xs = random_inputs(graph)
        np.testing.assert_allclose(m.run(xs)[0], interpret(graph, xs)[0], rtol=1e-6, atol=1e-7)
    finally:
        unregister_backend(picky.name)


def test_failed_compile_falls_back_to_reference_with_a_warning() -> None:
    broken = BrokenBackend("broken_test")
    register_backend(broken.name, lambda: broken, replace=True)
    try:
        graph = small_cnn()
        with pytest.warns(RuntimeWarning, match="failed to compile"):
            m = load(graph, backends=[broken.name])
        assert {p.backend for p in m.partitions} == {"reference"}
        xs = random_inputs(graph)
        np.testing.assert_array_equal(m.run(xs)[0], interpret(graph, xs)[0])
    finally:
        unregister_backend(broken.name)


def test_forced_placement_on_a_backend_that_cannot_run_the_node_warns() -> None:
    picky = InterpreterBackend("picky2_test", ops=("add",))
    register_backend(picky.name, lambda: picky, replace=True)
    try:
        graph = prepare_graph(small_cnn())
        conv = next(n for n in graph.nodes if n.op == "conv2d")
        with pytest.warns(RuntimeWarning, match="does not support"):
            m = load(graph, placement={conv.name: picky.name})
        assert all(p.backend == "reference" for p in m.partitions)
        with pytest.raises(EdgerunError, match="does not have"):
            load(graph, placement={"no_such_node": "reference"})
    finally:
        unregister_backend(picky.name)


def test_registry_names_what_is_missing() -> None:
    assert get_backend("reference").name == "reference"
    with pytest.raises(BackendUnavailableError, match="no backend named 'nonesuch'"):
        get_backend("nonesuch")
    with pytest.raises(BackendUnavailableError, match="no backend named"):
        load(small_cnn(), backends=["nonesuch"])


def test_registry_names_the_extra_when_a_dependency_is_missing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A backend module that imports a package that is not installed, as onnxruntime would be on a device.
    import sys

    pkg = tmp_path / "edgerun_fake_backends"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "needsdep.py").write_text("import edgerun_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from edgerun.backends import registry

    monkeypatch.setitem(registry._MODULES, "needsdep", "edgerun_fake_backends.needsdep")
    monkeypatch.setitem(registry._EXTRAS, "needsdep", "needsdep-extra")
    with pytest.raises(BackendUnavailableError, match=r"pip install edgerun\[needsdep-extra\]"):
        get_backend("needsdep")
    sys.modules.pop("edgerun_fake_backends.needsdep", None)


def test_compiled_reference_partition_runs_standalone() -> None:
    graph = prepare_graph(small_transformer_block())
    assignment = {n.name: "reference" for n in graph.nodes}
    (part,) = partition_graph(graph, assignment)
    compiled = get_backend("reference").compile(part.subgraph(graph))
    assert compiled.bind_node is not None
    xs = random_inputs(graph)
    got = dict(zip(compiled.graph.outputs, compiled(*xs)))  # partition outputs: in production order
    assert set(got) == set(graph.outputs)
    for name, want in zip(graph.outputs, interpret(graph, xs)):
        np.testing.assert_array_equal(got[name], want)


def test_placement_table_estimates_and_measures_every_partition(interp: InterpreterBackend) -> None:
    from edgerun.runtime.report import format_placement_table, partition_costs

    graph = small_cnn()
    nodes = prepare_graph(graph).nodes
    placement = {n.name: interp.name for n in nodes if n.op in ("add", "mul")}
    m = load(graph, placement=placement)
    costs = partition_costs(m, {"image": random_inputs(graph)[0]}, runs=2)
    assert [c.index for c in costs] == [p.index for p in m.partitions]
    assert {c.backend for c in costs} == {"reference", interp.name}
    assert all(c.estimated_s > 0 and c.measured_s is not None and c.measured_s > 0 for c in costs)
    assert sum(c.ops for c in costs) == len(m.graph.nodes)
    table = format_placement_table(costs).splitlines()
    assert len(table) == len(costs) + 3 and table[-1].startswith("total")
