"""The runtime on every zoo model: the plan is proved safe and within 1.15x of the lower bound; small models
run exactly like the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.oracle import interpret
from edgerun.runtime import load
from edgerun.runtime.loader import build_schedule
from edgerun.runtime.plan_verifier import verify_plan
from edgerun.runtime.schedule import value_lifetimes

pytest.importorskip("torch")
from edgerun import zoo
from edgerun.frontends.torch.export import export
from edgerun.passes.pipeline import optimize

RUN_AND_COMPARE = {"mlp", "din", "llama_small", "vit_tiny", "squeezenet1_1"}


@pytest.mark.parametrize("name", zoo.list_models())
def test_zoo_model_plans_within_bound_and_runs(name: str) -> None:
    model = zoo.get(name)
    graph, _ = optimize(export(model.build(), model.example_inputs()).graph)
    m = load(graph)
    lifetimes = value_lifetimes(build_schedule(m.partitions, m.parts.compiled), m.graph,
                                skip=[v for v in m.graph.specs if v not in m.plan.values])
    verify_plan(m.plan, lifetimes)
    assert m.plan.arena_bytes <= 1.15 * m.plan.lower_bound
    if name in RUN_AND_COMPARE:
        args = [a.numpy() for a in model.example_inputs()]
        for got, want in zip(m.run(args), interpret(graph, args)):
            np.testing.assert_array_equal(got, want)
