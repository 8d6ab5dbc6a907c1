"""The baseline TAPML compares against: per-op unit tests on random inputs.

For every distinct op signature (op, attrs, input specs) in a program, one case with inputs drawn the way a
unit-test author draws them (U(-1, 1) floats, in-range integers and indices, positive values for ops that
need them), at the model's own shapes, with the reference kernel's output as the oracle. The result is an
ordinary TestBundle, so `check` replays it exactly as it replays carved cases: the only difference between
the two is where the inputs came from.
"""

from __future__ import annotations

import numpy as np

from edgerun.devtools.bundle import ArrayRef, BundlePolicy, TestBundle, signature_of
from edgerun.ir.graph import Graph, Node
from edgerun.oracle import run_node

_POSITIVE = {"log", "sqrt", "rsqrt"}  # unit tests feed these their domain
_NONZERO_DIVISOR = {"div", "mod"}


def random_input(node: Node, k: int, graph: Graph, rng: np.random.Generator) -> np.ndarray:
    spec = graph.specs[node.inputs[k]]
    dt = spec.dtype.np
    if node.op == "gather" and k == 1:
        axis = int(node.attrs.get("axis", 0)) % max(graph.specs[node.inputs[0]].rank, 1)
        dim = graph.specs[node.inputs[0]].shape[axis]
        return rng.integers(0, dim, spec.shape).astype(dt)
    if spec.dtype.value == "bool":
        return rng.random(spec.shape) < 0.5
    if spec.dtype.is_int:
        info = np.iinfo(dt)
        lo, hi = max(int(info.min), -100), min(int(info.max), 100)
        if node.op in _NONZERO_DIVISOR and k == 1:
            lo = 1
        return rng.integers(lo, hi + 1, spec.shape).astype(dt)
    x = rng.uniform(-1, 1, spec.shape)
    if node.op in _POSITIVE:
        x = np.abs(x) + 0.01
    if node.op in _NONZERO_DIVISOR and k == 1:
        x = np.sign(x + 1e-9) * (np.abs(x) + 0.5)
    return x.astype(dt)


def random_unit_tests(graph: Graph, seed: int = 0, cases_per_signature: int = 1) -> TestBundle:
    """A bundle of random-input cases, `cases_per_signature` per distinct signature of `graph`."""
    rng = np.random.default_rng(seed)
    bundle = TestBundle(policy=BundlePolicy(max_cases_per_signature=cases_per_signature, max_bytes=1 << 40))
    seen: dict[str, int] = {}
    for node in graph.nodes:
        refs = [ArrayRef(None, (), "") if not i else
                ArrayRef("", graph.specs[i].shape, graph.specs[i].dtype.value) for i in node.inputs]
        sig = signature_of(node.op, node.attrs, refs)
        for _ in range(cases_per_signature - seen.get(sig, 0)):
            seen[sig] = seen.get(sig, 0) + 1
            ins = [random_input(node, k, graph, rng) if name else None for k, name in enumerate(node.inputs)]
            with np.errstate(all="ignore"):
                outs = run_node(node, [a for a in ins if a is not None], graph)
            bundle.add_case(node.op, node.name, node.attrs, ins, outs, seen[sig], 0)
    bundle.meta.update({"source": "random unit tests", "seed": seed})
    return bundle
