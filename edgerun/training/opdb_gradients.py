"""Gradients against torch.autograd on PyTorch's own op samples (op_db), float32 on CPU.

Each float32 sample of every OpInfo the torch frontend claims (frontends/torch/conformance.py) is exported
as a one-op module; the loss is sum(output * R) with a fixed random R per output, and the gradient of every
float input tensor is computed by the autodiff pass (run by the oracle) and by torch.autograd. Outcomes:

- pass: every gradient matches: |ours - torch| <= ATOL + RTOL * |torch|, NaN positions alike
- refused: differentiation raised an EdgerunError (an op with no gradient, said so by name)
- skipped: nothing to compare (no float input or output, torch's autograd refused, the forward itself is
  not supported or not captured by torch.export)
- wrong: different numbers, or an exception that is not an EdgerunError
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.frontends.torch.conformance import SampleResult, _OneOp, float32_samples, opinfo_name

RTOL = 1e-3  # gradients chain several float32 roundings on each side
ATOL = 1e-3
OUTCOMES = ("pass", "refused", "skipped", "wrong")


def run_sample(op: Any, index: int, sample: Any) -> SampleResult:
    import torch
    from torch.utils import _pytree as pytree

    from edgerun.frontends.torch.export import export_graph
    from edgerun.ir.builder import Builder
    from edgerun.oracle import interpret
    from edgerun.passes.autodiff import gradient_graph

    name = opinfo_name(op)
    start = time.perf_counter()

    def result(outcome: str, detail: str = "") -> SampleResult:
        return SampleResult(name, index, outcome, detail[:300], time.perf_counter() - start)

    module, tensors = _OneOp.make(op, sample)
    wrt = [i for i, t in enumerate(tensors) if t.dtype == torch.float32]
    if not wrt:
        return result("skipped", "no float32 input")
    leaves = [t.clone().requires_grad_(i in wrt) for i, t in enumerate(tensors)]
    try:
        outputs = [o for o in pytree.tree_leaves(module(*leaves)) if isinstance(o, torch.Tensor)]
        outputs = [o for o in outputs if o.dtype == torch.float32 and o.requires_grad]
        if not outputs:
            return result("skipped", "no differentiable float32 output")
        gen = np.random.default_rng(index)
        weights = [gen.standard_normal(tuple(o.shape)).astype(np.float32) for o in outputs]
        loss = sum((o * torch.from_numpy(w)).sum() for o, w in zip(outputs, weights))
        expected = torch.autograd.grad(loss, [leaves[i] for i in wrt], allow_unused=True)
    except Exception as exc:
        return result("skipped", f"torch autograd raised {type(exc).__name__}")
    try:
        graph = export_graph(module, tuple(t.detach() for t in tensors))
    except Exception as exc:
        return result("skipped", f"forward not exported: {type(exc).__name__}")
    float_outputs = [o for o in graph.outputs if graph.specs[o].dtype.name == "float32"]
    if len(float_outputs) != len(outputs):
        return result("skipped", "outputs differ from torch's differentiable ones")
    try:
        b = Builder(graph)
        total = None
        for o, w in zip(float_outputs, weights):
            if graph.specs[o].shape != w.shape:
                return result("skipped", "output shape differs")
            term = b.emit("reduce_sum", [b.binary("mul", o, b.const(w))])
            total = term if total is None else b.binary("add", total, term)
        assert total is not None
        names = [graph.inputs[i] for i in wrt]
        grads = gradient_graph(graph, total, names)
        got = interpret(grads, [t.numpy() for t in tensors])[len(graph.outputs):]
    except EdgerunError as exc:
        return result("refused", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return result("wrong", f"{type(exc).__name__}: {str(exc)[:200]} ({frame.filename.rsplit('/', 1)[-1]}:"
                               f"{frame.lineno})")
    for k, (g, e) in enumerate(zip(got, expected)):
        want = np.zeros(g.shape, np.float32) if e is None else e.detach().numpy()
        problem = _compare(g, want)
        if problem:
            return result("wrong", f"input {wrt[k]}: {problem}")
    return result("pass")


def _compare(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape}, torch {want.shape}"
    gn, wn = np.isnan(got), np.isnan(want)
    if not np.array_equal(gn, wn):
        return f"NaN positions differ ({int(gn.sum())} vs {int(wn.sum())})"
    ok = ~wn
    diff = np.abs(got[ok].astype(np.float64) - want[ok].astype(np.float64))
    bad = ~(diff <= ATOL + RTOL * np.abs(want[ok].astype(np.float64)))
    if bad.any():
        return f"{int(bad.sum())} of {want.size} gradient elements off, max abs error {np.nanmax(diff):.3g}"
    return ""


def run_opinfo(op: Any, max_samples: int | None = None) -> list[SampleResult]:
    results = []
    for i, sample in enumerate(float32_samples(op)):
        if max_samples is not None and i >= max_samples:
            break
        results.append(run_sample(op, i, sample))
    return results
