"""ONNX's own node test cases (~1,900, generated from the installed onnx package) against edgerun.

The whole suite runs here (about 35 s on one core), in one test so that it runs once: no wrong answers, no
unexplained errors, and the pass rate never drops below what docs/onnx-conformance.md reports.
"""

from __future__ import annotations

from edgerun.frontends.onnx.conformance import node_cases, run_cases, totals

# The floor under the measured rate in docs/onnx-conformance.md; raise it as coverage grows.
MIN_PASS_RATE = 0.96


def test_onnx_node_conformance():
    results = run_cases(node_cases())
    wrong = [f"{r.name}: {r.detail}" for r in results if r.status == "wrong"]
    assert wrong == [], "silent wrong answers"
    errors = [f"{r.name}: {r.detail}" for r in results if r.status == "error"]
    assert errors == [], "failures that are not explicit refusals"
    t = totals(results)
    assert t.cases > 1500 and t.denominator > 1000
    assert t.pass_rate >= MIN_PASS_RATE, f"{t.passed}/{t.denominator} = {t.pass_rate:.1%}"
    for r in results:
        if r.status == "refused":
            assert "unsupported" in r.detail or "invalid" in r.detail or "ONNX" in r.detail, r
