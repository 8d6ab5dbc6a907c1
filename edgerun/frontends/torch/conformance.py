"""Conformance against PyTorch's own op samples (torch.testing's op_db).

Each float32 CPU sample of every OpInfo that exercises an ATen op this frontend claims is wrapped in a
one-op nn.Module, exported through the frontend, run on the reference interpreter and compared with eager
PyTorch. Outcomes:

- pass: same shapes, dtypes, NaN positions; |ours - torch| <= ATOL + RTOL * |torch| (exact for ints/bools)
- unsupported: an EdgerunError from our frontend, IR or kernels (refused explicitly: acceptable)
- export_failure: torch.export itself could not capture the sample (not counted in the denominator)
- skipped: eager PyTorch raised, or the op returns non-tensors (nothing to compare)
- FAIL: wrong numbers, or any exception that is not an EdgerunError (a bug)
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError

RTOL = 1e-4
ATOL = 1e-4
OUTCOMES = ("pass", "unsupported", "export_failure", "skipped", "FAIL")

# OpInfos whose aten_name differs from the ATen op our handler serves.
EXTRA_OPINFOS: dict[str, tuple[str, ...]] = {
    "aten.convolution": ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose1d",
                         "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d"),
    "aten._native_batch_norm_legit_no_training": ("nn.functional.batch_norm",),
    "aten.native_layer_norm": ("nn.functional.layer_norm",),
    "aten._softmax": ("softmax",),
    "aten._log_softmax": ("log_softmax",),
    "aten.silu": ("nn.functional.silu",),
    "aten.hardsigmoid": ("nn.functional.hardsigmoid",),
    "aten.elu": ("nn.functional.elu",),
    "aten.threshold": ("nn.functional.threshold",),
    "aten.embedding": ("nn.functional.embedding",),
    "aten.scaled_dot_product_attention": ("nn.functional.scaled_dot_product_attention",),
    "aten._adaptive_avg_pool2d": ("nn.functional.adaptive_avg_pool2d",),
    "aten.max_pool2d_with_indices": ("nn.functional.max_pool2d",),
    "aten.upsample_nearest2d": ("nn.functional.interpolate",),
    "aten.reflection_pad2d": ("nn.functional.pad",),
    "aten.index": ("__getitem__",),
    "aten._to_copy": ("to",),
    "aten.sort": ("msort",),
    "aten.native_group_norm": ("nn.functional.group_norm",),
    "aten.diagonal": ("trace", "linalg.diagonal", "diagonal_copy"),
}


@dataclass
class SampleResult:
    op: str  # OpInfo name (with variant)
    index: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0


def claimed_opinfos(only: set[str] | None = None) -> list[Any]:
    """The OpInfos of op_db that exercise an ATen op the frontend claims (optionally only those named)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from edgerun.frontends.torch.supported import supported_aten_packets

    packets = supported_aten_packets()
    names = {p.removeprefix("aten.") for p in packets}
    extra = {n for p in packets for n in EXTRA_OPINFOS.get(p, ())}
    chosen = []
    for op in op_db:
        if (op.aten_name or op.name) in names or op.name in extra:
            full = opinfo_name(op)
            if only is None or full in only or op.name in only:
                chosen.append(op)
    return chosen


def opinfo_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def float32_samples(op: Any, seed: int = 0) -> Iterator[Any]:
    import torch

    torch.manual_seed(seed)
    yield from op.sample_inputs("cpu", torch.float32, requires_grad=False)


class _OneOp:
    """Builds a one-op nn.Module whose forward takes the sample's tensors and calls the op."""

    @staticmethod
    def make(op: Any, sample: Any) -> tuple[Any, tuple[Any, ...]]:
        import torch
        from torch.utils import _pytree as pytree

        structure = (sample.input, sample.args, sample.kwargs)
        leaves, spec = pytree.tree_flatten(structure)
        tensor_pos = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        fn = op.op

        class OneOp(torch.nn.Module):
            def forward(self, *tensors: Any) -> Any:
                filled = list(leaves)
                for pos, t in zip(tensor_pos, tensors):
                    filled[pos] = t
                inp, args, kwargs = pytree.tree_unflatten(filled, spec)
                return fn(inp, *args, **kwargs)

        return OneOp(), tuple(leaves[i].clone() for i in tensor_pos)


def run_sample(op: Any, index: int, sample: Any) -> SampleResult:
    import torch
    from torch.utils import _pytree as pytree

    from edgerun.frontends.torch.capture import ExportFailedError
    from edgerun.frontends.torch.export import export_graph
    from edgerun.oracle import interpret

    name = opinfo_name(op)
    start = time.perf_counter()

    def result(outcome: str, detail: str = "") -> SampleResult:
        return SampleResult(name, index, outcome, detail[:300], time.perf_counter() - start)

    module, tensors = _OneOp.make(op, sample)
    try:
        with torch.no_grad():
            expected = module(*[t.clone() for t in tensors])
    except Exception as exc:
        return result("skipped", f"eager raised {type(exc).__name__}")
    expected_leaves = pytree.tree_leaves(expected)
    if not expected_leaves or not all(isinstance(t, torch.Tensor) for t in expected_leaves):
        return result("skipped", "non-tensor output")
    if any(t.dtype in (torch.float64, torch.complex64, torch.complex128) for t in expected_leaves):
        return result("skipped", "output dtype outside float32 sample scope")
    try:
        graph = export_graph(module, tensors)
    except ExportFailedError as exc:
        return result("export_failure", str(exc).splitlines()[0])
    except EdgerunError as exc:
        return result("unsupported", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return result("FAIL", _describe(exc))
    try:
        got = interpret(graph, [t.numpy() for t in tensors])
    except EdgerunError as exc:
        return result("unsupported", f"{type(exc).__name__} at run time: {exc}")
    except Exception as exc:
        return result("FAIL", _describe(exc))
    problem = compare(got, [t.detach().numpy() for t in expected_leaves])
    return result("FAIL", problem) if problem else result("pass")


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> str:
    """"" when `got` matches `want`, else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, torch has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, torch {w.shape}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, torch {w.dtype}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return f"output {i}: {int(np.sum(g != w))} of {w.size} integer elements differ"
            continue
        gn, wn = np.isnan(g), np.isnan(w)
        if not np.array_equal(gn, wn):
            return f"output {i}: NaN positions differ ({int(gn.sum())} vs {int(wn.sum())})"
        ok = ~wn
        gv, wv = g[ok].astype(np.float64), w[ok].astype(np.float64)
        inf = np.isinf(wv)
        if not np.array_equal(gv[inf], wv[inf]):
            return f"output {i}: infinities differ"
        diff = np.abs(gv[~inf] - wv[~inf])
        bad = diff > ATOL + RTOL * np.abs(wv[~inf])
        if bad.any():
            return f"output {i}: {int(bad.sum())} of {w.size} elements off, max abs error {diff.max():.3g}"
    return ""


def _describe(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {str(exc)[:200]} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"


def run_opinfo(op: Any, max_samples: int | None = None) -> list[SampleResult]:
    results = []
    for i, sample in enumerate(float32_samples(op)):
        if max_samples is not None and i >= max_samples:
            break
        results.append(run_sample(op, i, sample))
    return results
