"""Conformance of the PyTorch frontend against PyTorch's own op samples (op_db), float32 on CPU.

    .venv/bin/python bench/torch_opdb.py                 # every claimed op, 2 worker processes
    .venv/bin/python bench/torch_opdb.py --ops add,mul   # a few OpInfos
    .venv/bin/python bench/torch_opdb.py --write-doc     # also regenerate docs/torch-opdb.md
    .venv/bin/python bench/torch_opdb.py --ops topk --update --write-doc  # rerun a few, keep the rest
    .venv/bin/python bench/torch_opdb.py --sweep         # every other OpInfo: which ATen ops lack a handler

Prints a table by op, writes bench/results/torch_opdb.json. Outcomes are defined in
edgerun/frontends/torch/conformance.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from edgerun.frontends.torch.conformance import OUTCOMES, SampleResult  # noqa: E402

# A few OpInfos (max_pool2d, interpolate) generate hundreds of combinatorial samples; the first 48 of each
# already cover their attribute combinations, and the cap keeps the full run under half an hour on 2 cores.
MAX_SAMPLES = 48
RESULTS = os.path.join(ROOT, "bench", "results", "torch_opdb.json")
SWEEP_RESULTS = os.path.join(ROOT, "bench", "results", "torch_opdb_sweep.json")
SWEEP_SAMPLES = 1  # the sweep asks only which ATen ops an OpInfo needs; its first sample finds most
_MISSING = re.compile(r"unsupported operator '(?P<op>[^']+)'.*no edgerun handler for this ATen op")


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def _run_one(task: tuple[str, int | None, bool]) -> list[dict[str, Any]]:
    _quiet()
    from torch.testing._internal.common_methods_invocations import op_db

    from edgerun.frontends.torch.conformance import claimed_opinfos, opinfo_name, run_opinfo

    name, max_samples, everything = task
    ops = [op for op in (op_db if everything else claimed_opinfos()) if opinfo_name(op) == name]
    try:
        return [asdict(r) for op in ops for r in run_opinfo(op, max_samples)]
    except Exception as exc:  # a sample generator that fails on this build (sweep only: unclaimed ops)
        if not everything:
            raise
        return [asdict(SampleResult(name, 0, "skipped", f"samples raised {type(exc).__name__}"))]


def run(names: list[str], jobs: int, max_samples: int | None, everything: bool = False) -> list[SampleResult]:
    results: list[SampleResult] = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for i, rows in enumerate(pool.map(_run_one, [(n, max_samples, everything) for n in names])):
            results += [SampleResult(**r) for r in rows]
            done = collections.Counter(r["outcome"] for r in rows)
            print(f"[{i + 1}/{len(names)}] {names[i]}: {dict(done)}", file=sys.stderr, flush=True)
            for r in rows:
                if r["outcome"] in ("FAIL", "unsupported"):
                    print(f"    {r['outcome']} [{r['index']}] {r['detail'][:200]}", file=sys.stderr, flush=True)
    return results


def summarise(results: list[SampleResult]) -> tuple[dict[str, collections.Counter[str]], collections.Counter[str]]:
    by_op: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        by_op[r.op][r.outcome] += 1
    total: collections.Counter[str] = collections.Counter(r.outcome for r in results)
    return dict(sorted(by_op.items())), total


def pass_rate(c: collections.Counter[str]) -> float:
    denom = c["pass"] + c["unsupported"] + c["FAIL"]
    return c["pass"] / denom if denom else 1.0


def table(by_op: dict[str, collections.Counter[str]], total: collections.Counter[str]) -> str:
    lines = ["| op | " + " | ".join(OUTCOMES) + " | pass rate |", "|---|" + "---:|" * (len(OUTCOMES) + 1)]
    for op, c in by_op.items():
        lines.append(f"| `{op}` | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {pass_rate(c):.0%} |")
    lines.append("| **total** | " + " | ".join(f"**{total[o]}**" for o in OUTCOMES)
                 + f" | **{pass_rate(total):.1%}** |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: every claimed op)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES,
                        help=f"first N samples per OpInfo (default {MAX_SAMPLES}; 0 for all)")
    parser.add_argument("--write-doc", action="store_true", help="regenerate docs/torch-opdb.md")
    parser.add_argument("--update", action="store_true",
                        help="with --ops: replace those OpInfos' rows in the saved results, keep the others")
    parser.add_argument("--sweep", action="store_true",
                        help=f"run the first {SWEEP_SAMPLES} samples of every OpInfo the frontend does not claim and "
                             f"count the ATen ops without a handler ({os.path.relpath(SWEEP_RESULTS, ROOT)})")
    parser.add_argument("--doc-only", action="store_true",
                        help=f"regenerate docs/torch-opdb.md from {os.path.relpath(RESULTS, ROOT)} without running")
    args = parser.parse_args()
    if args.doc_only:
        with open(RESULTS) as f:
            write_doc(json.load(f))
        return 0
    _quiet()
    from edgerun.frontends.torch.conformance import claimed_opinfos, opinfo_name

    if args.sweep:
        return sweep(args.jobs)
    only = set(args.ops.split(",")) if args.ops else None
    names = sorted({opinfo_name(op) for op in claimed_opinfos(only)})
    start = time.perf_counter()
    results = run(names, args.jobs, args.max_samples or None)
    seconds = time.perf_counter() - start
    if args.update:
        results, seconds = _merged(results, seconds)
    by_op, total = summarise(results)
    text = table(by_op, total)
    print(text)
    failures = [r for r in results if r.outcome == "FAIL"]
    for r in failures:
        print(f"FAIL {r.op}[{r.index}]: {r.detail}")
    print(f"\n{len(names)} OpInfos, {len(results)} samples, {dict(total)}, pass rate {pass_rate(total):.2%}, "
          f"{seconds:.0f} s")
    data = {"totals": dict(total), "pass_rate": pass_rate(total), "seconds": seconds,
            "max_samples": args.max_samples, "by_op": {k: dict(v) for k, v in by_op.items()},
            "not_passing": [asdict(r) for r in results if r.outcome in ("FAIL", "unsupported")]}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(data, f, indent=1)
    if args.write_doc:
        write_doc(data)
    return 1 if failures else 0


def _merged(results: list[SampleResult], seconds: float) -> tuple[list[SampleResult], float]:
    """The saved run's samples with the OpInfos just run replaced; passing samples are counted back from the
    saved per-op totals (the results file keeps details only for samples that did not pass)."""
    with open(RESULTS) as f:
        saved = json.load(f)
    rerun = {r.op for r in results}
    kept: list[SampleResult] = []
    for op, counts in saved["by_op"].items():
        if op in rerun:
            continue
        detailed = [SampleResult(**r) for r in saved["not_passing"] if r["op"] == op]
        kept += detailed
        for outcome, n in counts.items():
            left = n - sum(1 for r in detailed if r.outcome == outcome)
            kept += [SampleResult(op, -1, outcome) for _ in range(left)]
    return kept + results, saved["seconds"] + seconds


def sweep(jobs: int) -> int:
    """Every OpInfo of op_db the frontend does not claim, a few samples each: which ATen ops have no handler,
    ranked by how many OpInfos need them (a sample can stop at its first missing op, so counts are a floor)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from edgerun.frontends.torch.conformance import claimed_opinfos, opinfo_name

    claimed = {opinfo_name(op) for op in claimed_opinfos()}
    names = sorted({opinfo_name(op) for op in op_db} - claimed)
    start = time.perf_counter()
    results = run(names, jobs, SWEEP_SAMPLES, everything=True)
    needed: dict[str, set[str]] = collections.defaultdict(set)
    for r in results:
        m = _MISSING.search(r.detail)
        if m:
            needed[m["op"]].add(r.op)
    total = collections.Counter(r.outcome for r in results)
    ranked = sorted(needed.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for op, users in ranked:
        print(f"{len(users):4d}  {op}  ({', '.join(sorted(users)[:4])})")
    print(f"\n{len(names)} unclaimed OpInfos, {len(results)} samples, {dict(total)}, "
          f"{len(ranked)} ATen ops without a handler, {time.perf_counter() - start:.0f} s")
    data = {"totals": dict(total), "opinfos": len(names), "samples_per_opinfo": SWEEP_SAMPLES,
            "seconds": time.perf_counter() - start,
            "missing": [{"op": op, "opinfos": sorted(users)} for op, users in ranked],
            "passing_opinfos": sorted({r.op for r in results if r.outcome == "pass"}
                                      - {r.op for r in results if r.outcome != "pass"})}
    os.makedirs(os.path.dirname(SWEEP_RESULTS), exist_ok=True)
    with open(SWEEP_RESULTS, "w") as f:
        json.dump(data, f, indent=1)
    return 0


_REASON = re.compile(r"operator '(?P<op>[^']+)'(?: in module '[^']*')?(?: at \S+:\d+)?: (?P<why>.*)")


def _reason(detail: str) -> str:
    m = _REASON.search(detail)
    return f"`{m['op']}`: {m['why'][:110]}" if m else detail[:120]


def _sweep_section() -> str:
    """The ATen ops the sweep (--sweep) found without a handler, from its saved results."""
    if not os.path.exists(SWEEP_RESULTS):
        return ""
    with open(SWEEP_RESULTS) as f:
        sweep_data = json.load(f)
    from edgerun.frontends.torch.supported import supported_aten_ops

    totals = collections.Counter(sweep_data["totals"])
    handled = supported_aten_ops()  # ops given a handler since the sweep ran are no longer missing
    rows = "\n".join(f"| `{m['op']}` | {len(m['opinfos'])} | {', '.join(m['opinfos'][:4])} |"
                      for m in sweep_data["missing"] if m["op"] not in handled)
    return f"""
## What is still missing: the sweep over every other OpInfo

`.venv/bin/python bench/torch_opdb.py --sweep` runs the first {sweep_data["samples_per_opinfo"]} sample of each
of the {sweep_data["opinfos"]} OpInfos the frontend does not claim ({sweep_data["seconds"]:.0f} s): {totals["pass"]}
already pass through decompositions into claimed ops, {totals["unsupported"]} stop at an op without a handler
(or another refusal), {totals["skipped"]} are skipped and {totals["export_failure"]} fail in torch.export. The
ATen ops still without a handler, by how many OpInfos need them (a sample stops at its first missing op, so a
count is a floor; ops given a handler since the sweep ran are left out):

| ATen op | OpInfos | e.g. |
|---|---:|---|
{rows}
"""


def write_doc(data: dict[str, Any]) -> None:
    """docs/torch-opdb.md from the results JSON this script writes."""
    import torch

    total: collections.Counter[str] = collections.Counter(data["totals"])
    by_op = {k: collections.Counter(v) for k, v in data["by_op"].items()}
    reasons = collections.Counter(_reason(r["detail"]) for r in data["not_passing"] if r["outcome"] == "unsupported")
    top = "\n".join(f"- {n} x {reason}" for reason, n in reasons.most_common(20))
    fails = "\n".join(f"- `{r['op']}[{r['index']}]`: {' '.join(r['detail'].split())[:160]}" for r in data["not_passing"]
                      if r["outcome"] == "FAIL") or "None."
    max_samples = data.get("max_samples", MAX_SAMPLES)
    doc = f"""# PyTorch op-sample conformance (op_db)

The PyTorch frontend is checked against PyTorch's own op samples
(`torch.testing._internal.common_methods_invocations.op_db`, torch {torch.__version__}): every float32 CPU
sample (the first {max_samples} per OpInfo; `--max-samples 0` runs all) of every OpInfo that exercises an
ATen op the frontend claims (`edgerun.frontends.torch.supported_aten_ops()`, plus the OpInfos mapped in
`conformance.EXTRA_OPINFOS`) is wrapped in a one-op `nn.Module`, exported through
`edgerun.frontends.torch.export_graph`, run on the reference interpreter and compared with eager PyTorch
(|ours - torch| <= 1e-4 + 1e-4 * |torch|; NaN positions and infinities must match; integers and booleans
exactly).

Command (2 worker processes; {data["seconds"]:.0f} s wall on the shared 2-core machine, the full run and any
`--update` reruns of single OpInfos together):

    .venv/bin/python bench/torch_opdb.py --write-doc

Outcomes: **pass**; **unsupported**: the frontend, IR or a kernel refused the sample with an
`EdgerunError` naming the op (acceptable: never a wrong number); **export_failure**: `torch.export` itself
could not capture the sample (excluded from the rate); **skipped**: eager PyTorch raised, or the op returns
non-tensors or float64 (e.g. `to(torch.float64)`), which the IR has no dtype for; **FAIL**: a wrong number or a
non-edgerun exception (a bug; the target is zero). The pass rate is pass / (pass + unsupported + FAIL).

**Totals: {len(by_op)} OpInfos, {sum(total.values())} samples: {total['pass']} pass, {total['unsupported']}
unsupported, {total['FAIL']} FAIL, {total['export_failure']} export failures, {total['skipped']} skipped;
pass rate {pass_rate(total):.1%}.**

The CI subset (`tests/torch/test_torch_opdb_subset.py`: 22 OpInfos, the first 6 samples each) asserts
zero FAILs and at least 95% passing.

## Notes on some handlers

- Transposed convolutions (`nn.ConvTranspose1d/2d/3d`: groups, dilation, output padding, unbatched input):
  1-D runs as 2-D over a height of one; 2-D is the IR's `conv_transpose2d` composite, kept whole for engines
  with a ConvTranspose kernel and valid over symbolic H and W; 3-D, which has no IR op, is a sum over the
  kernel's depth taps of 2-D transposed convolutions with the depth folded into the batch
  (`edgerun/frontends/torch/aten_conv_transpose.py`).
- `topk`, `sort`, `argsort`, `msort` are the IR's `top_k` composite (sort is top-k of the whole axis): ties
  keep index order (torch's stable sort; torch's default CPU sort gives the same order) and NaN ranks above
  every number, as in torch. The ranking compares all pairs, so an axis whose pairwise table would pass
  2^24 elements (about 4000 per row) is refused with that reason rather than run slowly.
- `gather` and `diagonal` are one IR gather over the flattened input (static shapes); `native_group_norm` and
  `var_mean` / `std_mean` are written with reductions; `tan` (sin / cos), `erfc` (1 - erf), `hypot`,
  `fmax` / `fmin` (NaN-ignoring) with elementwise ops (`aten_composed_math.py`), all found by the sweep below.

## FAILs

{fails}

## Why samples were refused ("unsupported")

{top}

## By op

{table(by_op, total)}
{_sweep_section()}"""
    with open(os.path.join(ROOT, "docs", "torch-opdb.md"), "w") as f:
        f.write(doc)


if __name__ == "__main__":
    sys.exit(main())
