"""Shared by the search tests: a small graph every engine runs; a fake clock and fake engines on which the
search's decisions are exact."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.search.cost_model import CostTable


def small_conv_net(size: int = 32, seed: int = 2) -> Graph:
    """Three 3x3 conv + ReLU blocks, 8 channels, on a [1, 8, size, size] input."""
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, 8, size, size), DType.float32))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        w = b.const(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1)
        v = b.emit("relu", [b.emit("conv2d", [v, w], padding=[1, 1, 1, 1])])
    g.outputs = [v]
    return g


class FakeClock:
    """The search's clock in tests: time moves only when a fake candidate is built or called."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeTrial:
    """A loaded candidate whose n-th call (from 1) takes `call_s(n)` seconds on the fake clock, in
    `instructions` equal steps, the sink called after each (as the runtime calls it between instructions)."""

    def __init__(self, clock: FakeClock, call_s: Callable[[int], float], instructions: int = 1,
                 busy_after_call_s: float = 0.0) -> None:
        self.clock, self.call_s, self.instructions = clock, call_s, instructions
        self.busy_after_call_s = busy_after_call_s
        self.calls = 0
        self.released = False

    def release(self) -> None:
        assert not self.released, "released twice"
        self.released = True

    def run(self, inputs: object, sink: Callable[[object], None] | None = None) -> list[np.ndarray]:
        self.calls += 1
        step = self.call_s(self.calls) / self.instructions
        for _ in range(self.instructions):
            self.clock.advance(step)
            if sink is not None:
                sink(None)
        return []


class FakeEngines:
    """A candidate loader over made-up engines: a node on backend b takes `node_s[b]` per call (a fresh
    load's first call `first_call_s[b]` more), building a placement takes `build_s[b]` per backend it uses.
    `call_s` sets the call time of the placements over the given (sorted) backends outright. `loaded` lists
    the placements' backends in the order they were built."""

    def __init__(self, clock: FakeClock, node_s: dict[str, float], build_s: dict[str, float] | None = None,
                 first_call_s: dict[str, float] | None = None, instructions: int = 1,
                 call_s: dict[tuple[str, ...], float] | None = None) -> None:
        self.clock, self.node_s, self.call_s = clock, node_s, call_s or {}
        self.build_s, self.first_call_s = build_s or {}, first_call_s or {}
        self.instructions = instructions
        self.loaded: list[tuple[str, ...]] = []
        self.trials: list[FakeTrial] = []  # every candidate built, in order

    def call_seconds(self, placement: Mapping[str, str]) -> float:
        used = tuple(sorted(set(placement.values())))
        if used in self.call_s:
            return self.call_s[used]
        return sum(self.node_s[b] for b in placement.values())

    def __call__(self, placement: Mapping[str, str]) -> FakeTrial:
        used = tuple(sorted(set(placement.values())))
        self.loaded.append(used)
        self.clock.advance(sum(self.build_s.get(b, 0.0) for b in used))
        steady = self.call_seconds(placement)
        extra = sum(self.first_call_s.get(b, 0.0) for b in used)
        trial = FakeTrial(self.clock, lambda n: steady + (extra if n == 1 else 0.0), self.instructions)
        self.trials.append(trial)
        return trial


def chain(nodes: int = 6) -> Graph:
    """`nodes` dependent tanh nodes on a [1, 16] input: a graph whose cost table the tests write themselves."""
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, 16), DType.float32))
    for _ in range(nodes):
        v = b.emit("tanh", [v])
    g.outputs = [v]
    return g


def modelled_table(graph: Graph, per_node_s: dict[str, float]) -> CostTable:
    """A cost table in which every node costs `per_node_s[b]` on backend b, partitions and transfers free."""
    names = list(per_node_s)
    n, nb = len(graph.nodes), len(names)
    return CostTable(names, np.array([[per_node_s[b] for b in names]] * n), np.zeros(n), np.zeros(nb),
                     np.zeros(nb), np.zeros(nb), np.zeros((n, nb)))
