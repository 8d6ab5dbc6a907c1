"""Test carving (TAPML §III-C): run a program on the reference with realistic inputs and record every op
instance's inputs, attributes and outputs as a unit test.

The reference interpreter's per-node hook sees each call; the bundle deduplicates the arrays and applies the
size policy. The carved outputs are the oracle that `check` and `migrate` hold other backends to.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from edgerun.devtools.bundle import BundlePolicy, TestBundle
from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.ir.graph import Node
from edgerun.oracle import interpret


def carve(loaded: LoadedGraph, input_sets: Sequence[InputSet], policy: BundlePolicy | None = None,
          progress: bool = False) -> TestBundle:
    """A bundle with one case per op instance per input set (bounded by `policy`)."""
    graph = loaded.graph
    bundle = TestBundle(policy=policy or BundlePolicy())
    start = time.perf_counter()
    bar = _progress(len(graph.nodes) * len(input_sets), progress)
    for sample, inputs in enumerate(input_sets):
        def record(node: Node, args: list[np.ndarray], outs: list[np.ndarray], sample: int = sample) -> None:
            it = iter(args)
            positional = [next(it) if name else None for name in node.inputs]
            bundle.add_case(node.op, node.name, node.attrs, positional, outs, sample, sample)
            if bar is not None:
                bar.update(1)
        interpret(graph, inputs, hook=record, decompose=False)
    if bar is not None:
        bar.close()
    bundle.meta.update({
        "program": loaded.path, "program_hash": loaded.program_hash, "method": loaded.method,
        "source_backend": "reference",
        "input_sets": len(input_sets), "nodes": len(graph.nodes), "carve_seconds": time.perf_counter() - start,
    })
    return bundle


def carve_to(loaded: LoadedGraph, input_sets: Sequence[InputSet], out: str | os.PathLike[str],
             policy: BundlePolicy | None = None, progress: bool = False) -> TestBundle:
    bundle = carve(loaded, input_sets, policy, progress)
    bundle.save(out)
    return bundle


def _progress(total: int, enabled: bool):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="carve", unit="op", file=sys.stderr, disable=not sys.stderr.isatty())
