"""The memory planner and its verifier: hand-built lifetimes, random lifetimes, and real schedules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_testkit import random_dag, small_cnn, small_transformer_block

from edgerun.errors import VerificationError
from edgerun.runtime import load
from edgerun.runtime.memory_plan import (
    ALGORITHMS,
    ALIGNMENT,
    ArenaPlan,
    TensorLifetime,
    peak_live_bytes,
    plan_memory,
)
from edgerun.runtime.plan_verifier import verify_plan


def lifetimes(*specs: tuple[str, int, int, int]) -> dict[str, TensorLifetime]:
    return {name: TensorLifetime(name, nbytes, first, last) for name, nbytes, first, last in specs}


def test_disjoint_lifetimes_share_bytes_and_overlapping_ones_do_not() -> None:
    values = lifetimes(("a", 1000, 0, 1), ("b", 1000, 1, 2), ("c", 1000, 2, 3), ("d", 1000, 3, 4))
    plan = plan_memory(values)
    verify_plan(plan, values)
    # a and c never live together, nor b and d: two slots of 1024 suffice, and no plan can do better.
    assert plan.arena_bytes == 2048
    assert plan.lower_bound == 2000
    assert plan.naive_bytes == 4 * 1024
    assert plan.offsets["a"] != plan.offsets["b"]
    assert all(off % ALIGNMENT == 0 for off in plan.offsets.values())


def test_best_fit_fills_the_tightest_hole() -> None:
    # A big long-lived buffer, a short one that frees a hole, then a small one that fits the hole.
    values = lifetimes(("big", 4096, 0, 9), ("hole", 256, 0, 2), ("wall", 512, 0, 9), ("small", 200, 4, 6))
    plan = plan_memory(values, algorithms=["greedy_best_fit"])
    verify_plan(plan, values)
    assert plan.offsets["small"] == plan.offsets["hole"]
    assert plan.arena_bytes == 4096 + 512 + 256


def test_aliases_share_a_buffer_with_the_union_lifetime() -> None:
    values = lifetimes(("x", 512, 1, 2), ("x_view", 512, 2, 5), ("y", 512, 3, 4))
    plan = plan_memory(values, {"x_view": "x"})
    verify_plan(plan, values)
    assert plan.offset_of("x_view") == plan.offset_of("x")
    assert plan.buffers["x"] == TensorLifetime("x", 512, 1, 5)
    assert plan.offset_of("y") != plan.offset_of("x")


def test_verifier_rejects_shared_bytes_out_of_bounds_and_stale_lifetimes() -> None:
    values = lifetimes(("a", 128, 0, 2), ("b", 128, 1, 3))
    good = plan_memory(values)
    verify_plan(good, values)
    clash = ArenaPlan("hand", 256, {"a": 0, "b": 64}, good.buffers, good.values, {}, 256, 256, {})
    with pytest.raises(VerificationError, match="share bytes"):
        verify_plan(clash)
    small = ArenaPlan("hand", 192, {"a": 0, "b": 128}, good.buffers, good.values, {}, 256, 256, {})
    with pytest.raises(VerificationError, match="leaves"):
        verify_plan(small)
    unaligned = ArenaPlan("hand", 512, {"a": 0, "b": 130}, good.buffers, good.values, {}, 256, 256, {})
    with pytest.raises(VerificationError, match="aligned"):
        verify_plan(unaligned)
    longer = lifetimes(("a", 128, 0, 5), ("b", 128, 1, 3))
    with pytest.raises(VerificationError, match="lives"):
        verify_plan(good, longer)
    # A false alias (b declared to share a's bytes while both are live and different) must be caught too.
    lying = ArenaPlan("hand", 128, {"a": 0}, {"a": TensorLifetime("a", 128, 0, 2)}, good.values,
                      {"b": "a"}, 128, 256, {})
    with pytest.raises(VerificationError, match="does not fit"):
        verify_plan(lying)


lifetime_lists = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(lifetime_lists)
def test_random_lifetimes_plan_safely_between_the_bounds(specs: list[tuple[int, int, int]]) -> None:
    values = lifetimes(*((f"t{i}", n, first, first + span) for i, (n, first, span) in enumerate(specs)))
    plan = plan_memory(values)
    verify_plan(plan, values)
    assert plan.lower_bound <= plan.arena_bytes <= plan.naive_bytes
    assert plan.lower_bound == peak_live_bytes(list(values.values()))
    assert set(plan.candidates) <= set(ALGORITHMS)
    assert plan.arena_bytes == min(plan.candidates.values())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_random_graph_schedules_plan_safely(seed: int) -> None:
    m = load(random_dag(seed))
    from edgerun.runtime.loader import build_schedule
    from edgerun.runtime.schedule import value_lifetimes
    recomputed = value_lifetimes(build_schedule(m.partitions, m.parts.compiled), m.graph,
                                 skip=[v for v in m.graph.specs if v not in m.plan.values])
    verify_plan(m.plan, recomputed)


@pytest.mark.parametrize("make", [small_cnn, small_transformer_block], ids=["cnn", "transformer"])
def test_arena_is_close_to_the_lower_bound_on_model_graphs(make) -> None:  # type: ignore[no-untyped-def]
    m = load(make())
    verify_plan(m.plan)
    assert m.plan.arena_bytes <= 1.15 * m.plan.lower_bound + ALIGNMENT
    assert m.plan.arena_bytes < m.plan.naive_bytes / 2
    assert m.parts.arena.nbytes == m.plan.arena_bytes
    assert m.parts.arena.ctypes.data % ALIGNMENT == 0


def test_views_of_live_values_never_overlap_in_memory() -> None:
    m = load(small_cnn())
    plan = m.plan
    names = [n for n in plan.values if plan.values[n].nbytes]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            la, lb = plan.values[a], plan.values[b]
            if la.first <= lb.last and lb.first <= la.last and plan.buffer_of(a) != plan.buffer_of(b):
                assert not np.shares_memory(m.value(a), m.value(b)), (a, b)
