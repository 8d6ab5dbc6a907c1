"""A CI-sized slice of the op_db conformance run (bench/torch_opdb.py runs all of it).

For a fixed list of OpInfos covering each handler family, every float32 sample must either pass or be
refused with an EdgerunError: zero wrong answers, and at least 95% passing. See docs/torch-opdb.md.
"""

from __future__ import annotations

import collections
import warnings

import pytest

from edgerun.frontends.torch.conformance import claimed_opinfos, opinfo_name, run_opinfo

# One or two OpInfos per handler family; chosen for coverage at a small sample count.
SUBSET = (
    "add", "div.floor_rounding", "pow", "clamp", "where", "eq",
    "sum", "amax", "softmax", "var",
    "cat", "transpose", "index_select", "roll",
    "nn.functional.linear", "nn.functional.conv2d", "nn.functional.layer_norm", "nn.functional.gelu",
    "nn.functional.max_pool2d", "nn.functional.scaled_dot_product_attention", "nn.functional.conv_transpose2d", "topk",
)


@pytest.fixture(scope="module")
def results() -> list:
    warnings.filterwarnings("ignore")
    ops = claimed_opinfos(set(SUBSET))
    assert sorted({opinfo_name(op) for op in ops} & set(SUBSET)) == sorted(SUBSET)
    return [r for op in ops if opinfo_name(op) in SUBSET for r in run_opinfo(op, max_samples=6)]


def test_no_wrong_answers(results: list) -> None:
    failures = [f"{r.op}[{r.index}]: {r.detail}" for r in results if r.outcome == "FAIL"]
    assert not failures, "\n".join(failures)


def test_at_least_95_percent_pass(results: list) -> None:
    counts = collections.Counter(r.outcome for r in results)
    judged = counts["pass"] + counts["unsupported"] + counts["FAIL"]
    assert judged >= 70, counts
    assert counts["pass"] / judged >= 0.95, counts
