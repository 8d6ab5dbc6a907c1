"""`edgerun migrate QUANT --against FLOAT`: bring a program's quantized layers in one at a time (TAPML's order).

`migrate` moves ops from a source backend to a target one step by step and stops at the first step that
breaks the model. Here the source is the float program and the target its quantized twin: each step is one
quantized layer, in the float program's execution order, and both of migrate's checks have a counterpart:

1. layer-wise: only this layer quantized (every other layer's output replaced by the float program's value),
   the SQNR of its own output: what the layer loses by itself;
2. model-wise: this layer and every earlier one quantized, later ones float, the SQNR of the graph outputs.

The hybrids are runs of the float program on the reference interpreter in which each migrated layer's output
is computed by the quantized program's nodes for it, from the hybrid's values at that point (a uint8 input
standing for a folded layer is the float value quantized with its own scale and zero point, which gives the
quantized program's value back), so errors flow downstream and no program is rebuilt; with every layer
migrated the hybrid is the quantized program. A layer is a value both programs hold (by name, as
`edgerun quantize` keeps them) that the quantized program computes with another op. The first step whose model-wise SQNR falls below `min_snr_db` is named, with
whether the layer itself loses that much or the error had been accumulating.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.devtools.quant_inspect import quantization_metadata
from edgerun.errors import EdgerunError
from edgerun.ir.decompose import decomposed
from edgerun.ir.graph import Graph, Node
from edgerun.oracle import bind_inputs, run_node


@dataclass(frozen=True)
class QuantStep:
    layer: str  # the float value the quantized layer produces
    op: str  # of the float node producing it
    layer_snr_db: float  # this layer alone quantized: SQNR of its own output
    model_snr_db: float  # this and every earlier layer quantized: worst SQNR over the outputs and input sets
    passed: bool

    def to_json(self) -> dict[str, Any]:
        def db(v: float) -> float | None:
            return None if math.isinf(v) else round(v, 3)
        return {"layer": self.layer, "op": self.op, "layer_snr_db": db(self.layer_snr_db),
                "model_snr_db": db(self.model_snr_db), "passed": self.passed}


@dataclass
class QuantMigrationReport:
    scheme: str
    min_snr_db: float
    layers: int  # quantized layers found
    steps: list[QuantStep] = field(default_factory=list)

    @property
    def failed(self) -> QuantStep | None:
        return next((s for s in self.steps if not s.passed), None)

    @property
    def passed(self) -> bool:
        return self.failed is None

    def summary(self) -> str:
        f = self.failed
        if f is None:
            return (f"migrated all {self.layers} {self.scheme} layers from the float program; the outputs keep "
                    f"at least {self.min_snr_db:g} dB SQNR at every step")
        alone = ("the layer alone loses that much" if f.layer_snr_db < self.min_snr_db else
                 f"the layer alone keeps {f.layer_snr_db:.1f} dB: the error accumulated over the earlier layers")
        return (f"FAILED at step {len(self.steps)} of {self.layers}: quantizing {f.layer!r} ({f.op}) drops the "
                f"outputs to {f.model_snr_db:.1f} dB SQNR (< {self.min_snr_db:g}); {alone}")

    def table(self) -> str:
        head = f"{'step':>4} {'layer':<32} {'op':<10} {'alone dB':>9} {'model dB':>9}"
        lines = [head, "-" * len(head)]
        for k, s in enumerate(self.steps, 1):
            lines.append(f"{k:>4} {s.layer[:32]:<32} {s.op[:10]:<10} {s.layer_snr_db:>9.1f} {s.model_snr_db:>9.1f}"
                         f"{'' if s.passed else '  <- FAIL'}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        f = self.failed
        return {"scheme": self.scheme, "min_snr_db": self.min_snr_db, "layers": self.layers, "passed": self.passed,
                "failed": f.layer if f else None, "steps": [s.to_json() for s in self.steps]}

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)


def _snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    r, g = ref.astype(np.float64), got.astype(np.float64)
    noise = float(np.sum((r - g) ** 2))
    return math.inf if noise == 0 else 10 * math.log10(max(float(np.sum(r ** 2)), 1e-30) / noise)


def quantized_layers(quantized: Graph, source: Graph, uint8_values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(float value, float op) of each layer the quantized graph computes with another op, in `source`'s order."""
    producer = {o: n.op for n in quantized.nodes for o in n.outputs}
    return [(out, node.op) for node in source.nodes for out in node.outputs
            if source.specs[out].dtype.value == "float32"
            and (out in uint8_values or (out in producer and producer[out] != node.op))]


class _QuantizedLayers:
    """Evaluates one quantized layer of the quantized graph on the float program's current values."""

    def __init__(self, quantized: Graph, source: Graph, uint8: Mapping[str, tuple[str, np.float32, int]]) -> None:
        self.graph, self.uint8 = quantized, uint8
        self.stands_for = {q: name for name, (q, _, _) in uint8.items()}
        self.producer = {o: n for n in quantized.nodes for o in n.outputs}
        self.order = {id(n): i for i, n in enumerate(quantized.nodes)}
        # float values both programs hold: a quantized layer reads its inputs from there
        self.shared = {v for v, spec in source.specs.items()
                       if v in quantized.specs and quantized.specs[v] == spec} | set(source.inputs)

    def _boundary(self, name: str) -> bool:
        return name in self.graph.constants or name in self.shared or name in self.stands_for

    def nodes(self, layer: str) -> list[Node]:
        """The quantized graph's nodes computing `layer` from shared float values, uint8 stand-ins, constants."""
        top = self.uint8[layer][0] if layer in self.uint8 else layer
        needed: dict[int, Node] = {}
        stack = [self.producer[top]]
        while stack:
            node = stack.pop()
            if id(node) in needed:
                continue
            needed[id(node)] = node
            stack += [self.producer[i] for i in node.inputs if i and not self._boundary(i)]
        return sorted(needed.values(), key=lambda n: self.order[id(n)])

    def evaluate(self, layer: str, nodes: list[Node], env: Mapping[str, np.ndarray]) -> np.ndarray:
        local: dict[str, np.ndarray] = {}

        def value(name: str) -> np.ndarray:
            if name in local:
                return local[name]
            if name in self.graph.constants:
                return self.graph.constants[name]
            if name in self.stands_for:  # a folded layer's uint8 result: the float value in that form
                _, scale, zp = self.uint8[self.stands_for[name]]
                info = np.iinfo(self.graph.specs[name].dtype.np)
                q = np.clip(np.rint(env[self.stands_for[name]] / scale) + zp, info.min, info.max)
                return q.astype(self.graph.specs[name].dtype.np)
            return env[name]

        for node in nodes:
            local.update(zip(node.outputs, run_node(node, [value(i) for i in node.inputs if i], self.graph)))
        if layer in self.uint8:
            q, scale, zp = self.uint8[layer]
            return ((local[q].astype(np.float32) - np.float32(zp)) * scale).astype(np.float32)
        return local[layer]


def migrate_against_float(quantized: LoadedGraph, source: LoadedGraph, input_sets: Sequence[InputSet],
                          min_snr_db: float = 20.0) -> QuantMigrationReport:
    """Quantize `source`'s layers one at a time in execution order, as `quantized` does; stop at the first
    step whose outputs fall below `min_snr_db` SQNR against the float program."""
    meta = quantization_metadata(quantized, source, "the program to migrate")
    if not input_sets:
        raise EdgerunError("migrate --against needs at least one input set")
    uint8 = {str(k): (str(v["value"]), np.float32(v["scale"]), int(v["zero_point"]))
             for k, v in meta.get("uint8_values", {}).items()}
    q_graph, f_graph = decomposed(quantized.graph), decomposed(source.graph)
    layers = quantized_layers(q_graph, f_graph, uint8)
    if not layers:
        raise EdgerunError("no quantized layer found: the two programs compute every shared value the same way")
    evaluator = _QuantizedLayers(q_graph, f_graph, uint8)
    plans = {name: evaluator.nodes(name) for name, _ in layers}
    report = QuantMigrationReport(str(meta.get("scheme", "?")), min_snr_db, len(layers))
    refs = [_hybrid(f_graph, inputs, evaluator, plans, set()) for inputs in input_sets]
    for k, (name, op) in enumerate(layers):
        alone = min(_snr_db(ref[name], _hybrid(f_graph, inputs, evaluator, plans, {name})[name])
                    for inputs, ref in zip(input_sets, refs))
        migrated = {n for n, _ in layers[:k + 1]}
        model = min(_snr_db(ref[out], env[out])
                    for inputs, ref in zip(input_sets, refs)
                    for env in [_hybrid(f_graph, inputs, evaluator, plans, migrated)]
                    for out in f_graph.outputs)
        report.steps.append(QuantStep(name, op, alone, model, model >= min_snr_db))
        if model < min_snr_db:
            break
    return report


def _hybrid(graph: Graph, inputs: InputSet, layers: _QuantizedLayers, plans: Mapping[str, list[Node]],
            migrated: set[str]) -> dict[str, np.ndarray]:
    """Every value of the float graph, with each `migrated` layer's output computed by its quantized form
    from the values before it (so the error of earlier migrated layers flows into later ones)."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(bind_inputs(graph, [inputs[n] for n in graph.inputs]))
    for node in graph.nodes:
        env.update(zip(node.outputs, run_node(node, [env[i] for i in node.inputs if i], graph)))
        for out in node.outputs:
            if out in migrated:
                env[out] = layers.evaluate(out, plans[out], env)
    return env
