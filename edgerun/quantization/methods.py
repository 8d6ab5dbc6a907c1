"""quantize for a program with state or several methods: each method's graph is quantized on its functional
form (ir/state.py), where the states it reads are inputs and its updates outputs. So a state is never taken
for a weight and stays float (a KV cache is written at run time; quantizing it is another scheme), and the
schemes that only rewrite weights apply unchanged. A weight several methods share comes out quantized the
same in each, and the writer stores identical bytes once, so the file keeps one copy of the weights.

Schemes that calibrate activations (int8-static) are refused: a method's activations depend on the state
its calls build up, and a calibration file holds samples of one entry point's inputs, not call sequences.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.ir.state import from_functional, to_functional
from edgerun.passes.pipeline import optimize, template_pipeline
from edgerun.program import Program
from edgerun.quantization.flow import SCHEMES, QuantizeReport, exclude_names, quantize_graph


def weights_only_schemes() -> list[str]:
    return [name for name, (_, calibrated, _) in SCHEMES.items() if not calibrated]


def quantize_methods(program: Program, scheme: str,
                     calibration: Mapping[str, np.ndarray] | str | os.PathLike[str] | None,
                     exclude: Sequence[str], group_size: int, reduce_range: bool
                     ) -> tuple[dict[str, Graph], QuantizeReport]:
    """Each method's quantized graph (state fields kept), and one report of what was left in float."""
    what = "state" if program.state else "several methods"
    if SCHEMES[scheme][1]:
        raise EdgerunError(f"scheme {scheme!r} calibrates activations on samples of one entry point's inputs; a "
                           f"program with {what} has activations that depend on its calls: use a weights-only "
                           f"scheme ({', '.join(weights_only_schemes())})")
    if calibration is not None:
        raise EdgerunError(f"calibration= is not taken for a program with {what} (its per-layer report would "
                           "need a sequence of calls per method); the weights-only schemes need none")
    graphs: dict[str, Graph] = {}
    known: set[str] = set()
    skipped: list[str] = []
    quantized_layers: list[str] = []
    for name, graph in program.methods.items():
        functional, signature = to_functional(graph)
        optimized, _ = optimize(functional, template_pipeline() if functional.symbols else None)
        known |= exclude_names(optimized, scheme)
        quantized, report, _ = quantize_graph(optimized, scheme, [], exclude, group_size, "minmax", 0, reduce_range,
                                              check_exclude=False)
        graphs[name] = from_functional(quantized, signature)
        skipped += [s for s in report.skipped if s not in skipped]
        quantized_layers += [f"{name}:{q}" for q in report.quantized]
    unknown = [e for e in exclude if e not in known]
    if unknown:
        raise EdgerunError(f"--exclude {unknown}: no layer or op type of that name in any method "
                           f"({', '.join(program.methods)})")
    return graphs, QuantizeReport(scheme, skipped=skipped, quantized=quantized_layers)
