"""ONNX node-test conformance of edgerun (reference backend) beside ONNX Runtime, on the same cases.

    .venv/bin/python bench/onnx_conformance.py            # writes docs/onnx-conformance.md and
                                                           # bench/results/onnx_conformance.json
                                                           # (ONNX Runtime's column is whatever version
                                                           # is installed; both versions are recorded)
    .venv/bin/python bench/onnx_conformance.py --zoo      # every zoo model: torch.onnx.export -> from_onnx,
                                                           # against torch eager and the torch-export path
    .venv/bin/python bench/onnx_conformance.py --values   # first-call / steady cost of a value template
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgerun.frontends.onnx.categories import DESIGN_CATEGORIES, DESIGN_OUTLOOK  # noqa: E402
from edgerun.frontends.onnx.conformance import (  # noqa: E402
    CaseResult,
    edgerun_runner,
    node_cases,
    ort_runner,
    run_case,
    run_cases,
    symbolic_runner,
    totals,
)

COMMAND = ".venv/bin/python bench/onnx_conformance.py"
BACKENDS = ["mnn", "reference"]  # --values: edgerun's own CPU kernels, the reference for the rest

# Why an earlier committed ONNX Runtime column read lower, checked case by case (see docs/onnx-conformance.md).
ORT_COLUMN_HISTORY = (
    "The ONNX Runtime column depends on the onnxruntime version installed: `requirements.txt` asks for "
    "`onnxruntime>=1.20`, unpinned. The column committed on 2026-11-21 (1241 of 1422 passed, 87.3%, 159 "
    "refused, 22 wrong) came from onnxruntime 1.31.1; the version was not recorded then. onnxruntime 1.31.1 "
    "supports the default ONNX domain up to opset 26 and refuses models stamped with a newer opset (\"Opset "
    "28 is under development ... Current official support for domain ai.onnx is till opset 26\"): 138 of the "
    "1422 cases counted then (onnx 1.23.2) are stamped opset 27 or 28, and onnxruntime 1.32.0 passes 126 of "
    "them. 1.31.1 also rejects the graph of 11 Attention cases (opset 24/25) that 1.32.0 passes. 126 + 11 = "
    "137 more passes: 1378 of 1422 (96.9%). The remaining 22 cases are refused by 1.32.0 too (missing kernels"
    " such as RoiAlign-22, BitCast-26). Running this script's ONNX Runtime runner with onnxruntime 1.31.1 "
    "(its wheel unpacked on `PYTHONPATH` ahead of the venv) reproduces the old column exactly, with the same "
    "status for every case. The edgerun column does not depend on onnxruntime. The script and this page were "
    "committed once and never changed (`git log -p -- bench/onnx_conformance.py docs/onnx-conformance.md`): "
    "the difference is the environment, not the method. Both versions are now recorded above.")


# How the cases that feed a structure-deciding value as a graph input pass without freezing it.
VALUE_INPUTS_NOTE = (
    "These cases feed, as a graph input, a value the importer needs as a constant: it decides the program's "
    "structure, not a size. Most are reduction or unsqueeze axes (which axes go, and the output rank), "
    "Resize's scales or sizes (the interpolation matrices and, from float scales, the output size), TopK's k "
    "and OneHot's depth (an output size read from a value), Split sizes, and Reshape / Expand / Pad / Slice / "
    "Tile values. `from_onnx` imports such a model once as a `ValueTemplate` "
    "(`edgerun/frontends/onnx/value_template.py`): the inputs behind the first value the import needs become "
    "*value-deciding inputs* (at most 64 elements each, refused naming the input otherwise), and every call "
    "specialises the program on their values, as a symbol binding specialises it on shapes: the import runs "
    "again with the values folded in as constants, then the normal passes, and the result is cached under "
    "(the values' bytes, the symbol bindings), in the runtime's specialisation LRU for `edgerun.load` "
    "(`edgerun/runtime/specializing.py`). A call with other values never reuses a specialisation made for "
    "different ones. The inputs stay program inputs: nothing is frozen, and one import serves every value; "
    "the cost is an import per distinct value at its first call (MNN re-runs its shape computation at resize "
    "the same way). Where the value comes from no graph input (a control-flow body's), the case is refused.")


# What lifted the data-dependent, ai.onnx.ml, narrow dtype and string categories (the by-design count was 316,
# then 291, then 100, then 67).
DESIGN_SHRINK_NOTE = (
    "Before data-dependent ops and ai.onnx.ml, 316 cases were refused by design, 32 of them for data-dependent "
    "output shapes and 19 for other domains. NonZero, Unique, Compress and NonMaxSuppression now import as "
    "data-dependent IR ops (`edgerun/ir/ops/data_dependent_ops.py`): the output extent is a fresh symbol "
    "bounded by the input's size, the program runs in stages split at the node (`edgerun/ir/staging.py`; "
    "docs/design.md), and they pass here with static and with symbolic input dimensions. Their two bfloat16 "
    "cases now count under dtype, and ImageDecoder (needs image codecs) is its own category. ai.onnx.ml's "
    "numeric ops (Binarizer, ArrayFeatureExtractor, TreeEnsemble, and more tested against ONNX Runtime in "
    "`tests/onnx/test_onnx_ml.py`) import as ordinary IR ops (`edgerun/frontends/onnx/ml.py`); its LabelEncoder "
    "cases map strings and count under string. Then 291 were refused by design, 191 of them for element types "
    "numpy has no type for. bfloat16, float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0), float4 e2m1, int4/uint4 and "
    "int2/uint2 are now IR types backed by ml_dtypes (`edgerun/ir/dtypes.py`, imported only where one is "
    "used): Cast and CastLike convert through float32 with round-to-nearest-even, Cast's float8 `saturate` and "
    "float8e8m0's `round_mode`, "
    "QuantizeLinear and DequantizeLinear on them (and on int16/uint16) lower to float32 arithmetic and a Cast "
    "(`edgerun/frontends/onnx/quantized.py`), and data movement ops run on them on the reference; the program "
    "file holds one int4 or int2 per byte. All 191 moved into the denominator: 179 pass, 12 were refused "
    "by name (Softmax and Celu on bfloat16). bfloat16 elementwise ops (Celu, Elu, Exp, Tanh, ... "
    "`edgerun/frontends/onnx/narrow_float.py`) now compute in float32 and round each node's output, which "
    "gives ONNX's reference bits wherever its output is at least 2^-6 on every finite bfloat16 input "
    "(`tests/onnx/test_onnx_bfloat16.py`): the 2 Celu cases pass. The 10 Attention cases on bfloat16 stay "
    "refused by name at their Softmax: the reference rounds every intermediate to bfloat16, sums included, and "
    "float32 arithmetic rounded per node (or once for the whole op) differs by 1-2 bfloat16 ulps on 12-41% of "
    "each case's outputs, over its tolerance. ONNX Runtime, MNN, WebGPU and the NPU declare no kernel for the "
    "narrow types (ONNX Runtime's Python binding has no numpy type for such outputs), so placement keeps those "
    "nodes on the reference (`tests/onnx/test_onnx_narrow_dtypes.py`). The 33 string cases (Equal on strings, "
    "LabelEncoder, RegexFullMatch, StringConcat, StringNormalizer, StringSplit, TfIdfVectorizer) left the "
    "by-design count and pass: `string` is an IR element type (object arrays of Python str, "
    "`edgerun/ir/dtypes.py`) with ops of its own (`edgerun/ir/ops/string_ops.py`) that only the reference runs "
    "(every other backend declines a node reading or writing a string), StringSplit and StringNormalizer as "
    "data-dependent ops, and string constants stored length-prefixed in the program file "
    "(docs/program-format.md). Sequences and optionals (34 cases) resolve at import into tensors "
    "(`edgerun/frontends/onnx/sequences.py`: a sequence of known length is a list of tensors, an optional a "
    "tensor or nothing; sequence inputs are one program input per element, outputs come back as lists; Loops "
    "carrying one are unrolled); Adagrad, Adam and Momentum (7) import as arithmetic (`training.py`); "
    "FlexAttention (11) imports as matmul / softmax / matmul with its score_mod and prob_mod graphs inlined "
    "(`flex_attention.py`). All 52 pass. What stays by design: ImageDecoder (9; decoding JPEG/PNG/WebP needs an "
    "image codec library in the runtime) and Bernoulli (6; its expected outputs are one draw of numpy's "
    "generator, so no implementation can be checked against them); Gradient (autodiff), maps and complex types "
    "have no node case left. In the denominator, 32 more refusals pass: BitCast (10, the IR's bitcast), "
    "TensorScatter (3), block-wise Quantize/DequantizeLinear (3), STFT and MelWeightMatrix (3), opset-1 Not (3), "
    "BatchNormalization in training mode (2), scatter reduction='mul' (2), Det (2), one-sided inverse DFT (2), "
    "an Einsum diagonal and a Loop slicing by its counter (unrolled).")


def _ort_results(cases: list, design: dict[str, CaseResult]) -> list[CaseResult]:
    """ONNX Runtime on the same cases; any exception counts as a refusal, as ORT has no error taxonomy."""
    return [design[c.name] if design[c.name].status == "design" else
            run_cases([c], ort_runner, refusal=(Exception,))[0] for c in cases]


def versions() -> dict[str, str]:
    import numpy
    import onnx
    import onnxruntime
    return {"python": platform.python_version(), "machine": platform.machine(), "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__}


def _symbolic_results(cases: list, design: dict[str, CaseResult]) -> list[CaseResult]:
    """edgerun again with every input dimension a bounded symbol: one import serves every shape."""
    return [design[c.name] if design[c.name].status == "design" else run_case(c, symbolic_runner) for c in cases]


def build_markdown(ours: list[CaseResult], ort: list[CaseResult], sym: list[CaseResult], seconds: dict[str, float],
                   load: float) -> str:
    t, o, s = totals(ours), totals(ort), totals(sym)
    by_op: dict[str, Counter] = defaultdict(Counter)
    ort_pass: Counter = Counter()
    for r, q in zip(ours, ort):
        if r.status == "design":
            continue
        by_op[r.op][r.status] += 1
        by_op[r.op]["cases"] += 1
        ort_pass[r.op] += q.status == "pass"
    by_value = sum(1 for r in ours if r.status == "pass" and r.value_inputs)
    sym_by_value = sum(1 for r in sym if r.status == "pass" and r.value_inputs)
    design = Counter(r.category for r in ours if r.status == "design")
    design_ops: dict[str, set[str]] = defaultdict(set)
    for r in ours:
        if r.status == "design":
            design_ops[r.category].add(r.op)
    lines = [
        "# ONNX conformance",
        "",
        f"Generated by `{COMMAND}` (onnx node test cases from the installed `onnx` package). Do not edit by "
        "hand. Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + ". Wall times measured "
        f"under load (load average {load:.1f} at the start, `uptime`; the machine is shared).",
        "",
        "Every case is classified as **pass** (outputs match in count, shape, dtype and value within the "
        "ONNX runner's rtol/atol), **refused** (an explicit `EdgerunError`, e.g. `UnsupportedOpError`), "
        "**error** (any other exception: a bug) or **wrong** (outputs differ: a silent wrong answer).",
        "",
        "## Totals",
        "",
        "| | edgerun | ONNX Runtime |",
        "|---|---|---|",
        f"| node cases | {t.cases} | {o.cases} |",
        f"| refused by design (not in the denominator) | {t.design} | {o.design} |",
        f"| denominator | {t.denominator} | {o.denominator} |",
        f"| passed | {t.passed} ({t.pass_rate:.1%}) | {o.passed} ({o.pass_rate:.1%}) |",
        f"| refused | {t.refused} | {o.refused} (any exception) |",
        f"| error | {t.error} | - |",
        f"| wrong answers | {t.wrong} | {o.wrong} |",
        f"| passed without freezing an input value (none is frozen) | {t.passed} ({t.pass_rate:.1%}) | - |",
        f"| ... of which specialised per call on an input's value | {by_value} | - |",
        f"| passed with every input dimension symbolic | {s.passed} ({s.pass_rate:.1%}) | - |",
        f"| ... of which specialised per call on an input's value | {sym_by_value} | - |",
        f"| wrong answers with symbolic dimensions | {s.wrong} (error {s.error}) | - |",
        f"| wall time | {seconds['edgerun']:.1f} s (symbolic {seconds['symbolic']:.1f} s) | {seconds['ort']:.1f} s |",
        "",
        f"{by_value} of edgerun's passes feed structure-deciding values (reduction axes, Resize scales, Reshape "
        "targets) as graph inputs. They are imported once as a template that specialises per call on those "
        "inputs' values (cached per value), not frozen: see 'Passes that specialise on an input value' below. "
        "The ONNX backend (`edgerun/frontends/onnx/backend.py`) freezes no input: before value-deciding "
        "inputs it imported such models for the values given to `run`, and 1124 of 1427 (78.8%) passed "
        "without that.",
        "",
        "**With every input dimension symbolic** (`EdgerunBackend.prepare(model, symbolic_dims=True)`), every "
        "input dimension of size 2 or more is declared a symbol bounded by [2, 65536] before import, one symbol "
        "per distinct size (`n4` for every dimension of 4, so the operands of an Add keep one shape), sizes 0 "
        "and 1 static (as torch.export specialises them: a size-1 dimension broadcasts). This is stricter than "
        "a real model, whose exporter makes only batch or sequence axes dynamic: here channel counts, head "
        "sizes and kernel sizes are symbols too, and two unrelated dimensions of one size are one symbol. The "
        "import runs once, the shape arithmetic folds over the symbols, and each call binds them from its "
        "inputs' shapes and runs the specialisation (`edgerun/ir/specialize.py`), checked by the verifier. A "
        "case the template cannot express is refused at import naming its node (below); none may give a wrong "
        "answer.",
        "",
        "## The ONNX Runtime column",
        "",
        ORT_COLUMN_HISTORY,
        "",
        "## Refused by design",
        "",
        DESIGN_SHRINK_NOTE,
        "",
        "| category | cases | ops | why | what would lift it |",
        "|---|---|---|---|---|",
    ]
    for cat, why in DESIGN_CATEGORIES.items():
        ops = ", ".join(sorted(design_ops.get(cat, set())))
        lines.append(f"| {cat} | {design.get(cat, 0)} | {ops} | {why} | {DESIGN_OUTLOOK[cat]} |")
    lines += ["", "## By op", "", "| op | cases | passed | refused | failed | ORT passed |", "|---|---|---|---|---|---|"]
    for op in sorted(by_op):
        c = by_op[op]
        lines.append(f"| {op} | {c['cases']} | {c['pass']} | {c['refused']} | {c['error'] + c['wrong']} "
                     f"| {ort_pass[op]} |")
    refusals: dict[str, list[CaseResult]] = defaultdict(list)
    for r in ours:
        if r.status == "refused":
            refusals[r.op].append(r)
    lines += ["", "## Refusals in the denominator", "", "| op | cases | first reason |", "|---|---|---|"]
    for op in sorted(refusals):
        reason = refusals[op][0].detail.replace("|", "/")
        lines.append(f"| {op} | {len(refusals[op])} | {reason[:160]} |")
    failures = [r for r in ours if r.status in ("error", "wrong")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{r.name}` ({r.status}): {r.detail}" for r in failures]
    sym_misses: dict[str, list[CaseResult]] = defaultdict(list)
    for r, q in zip(ours, sym):
        if r.status == "pass" and q.status != "pass":
            sym_misses[q.op].append(q)
    lines += ["", "## Passes lost with symbolic dimensions", "",
              "Cases that pass with static inputs but not with every input dimension symbolic, by op: "
              "what the template cannot express.", "", "| op | cases | status | first reason |",
              "|---|---|---|---|"]
    for op in sorted(sym_misses):
        first = sym_misses[op][0]
        reason = first.detail.replace("|", "/").replace("\n", " ")
        lines.append(f"| {op} | {len(sym_misses[op])} | {first.status} | {reason[:200]} |")
    valued_by_op: Counter = Counter(r.op for r in ours if r.status == "pass" and r.value_inputs)
    sym_valued = Counter(r.op for r in sym if r.status == "pass" and r.value_inputs)
    lines += ["", "## Passes that specialise on an input value", "", VALUE_INPUTS_NOTE, "",
              "| op | cases | also with symbolic dimensions | value-deciding inputs (first case) |",
              "|---|---|---|---|"]
    for op, n in sorted(valued_by_op.items()):
        first = next(r for r in ours if r.op == op and r.status == "pass" and r.value_inputs)
        lines.append(f"| {op} | {n} | {sym_valued[op]} | {first.value_inputs} |")
    ort_misses = [q for q in ort if q.status in ("refused", "wrong", "error")]
    lines += ["", "## ONNX Runtime's misses", "", "| case | status | first reason |", "|---|---|---|"]
    for q in ort_misses:
        reason = q.detail.replace("|", "/").replace("\n", " ")
        lines.append(f"| {q.name} | {q.status} | {reason[:160]} |")
    return "\n".join(lines) + "\n"


def zoo_check() -> int:
    """Each zoo model through torch.onnx.export + from_onnx, compared with eager and torch export."""
    import io

    import numpy as np
    import torch

    import edgerun.zoo as zoo
    from edgerun.frontends.onnx import from_onnx
    from edgerun.frontends.torch import export
    from edgerun.oracle import interpret

    rows: list[dict[str, object]] = []
    worst = 0.0
    print(f"{'model':<16}{'vs eager':>12}{'vs export':>12}{'import s':>10}")
    for name in zoo.list_models():
        entry = zoo.get(name)
        module = entry.build().eval()
        args = tuple(entry.example_inputs())
        buf = io.BytesIO()
        torch.onnx.export(module, args, buf, opset_version=17, dynamo=False)
        start = time.perf_counter()
        program = from_onnx(buf.getvalue())
        seconds = time.perf_counter() - start
        arrays = [a.numpy() for a in args]
        got = interpret(program.graph, arrays)[0]
        with torch.no_grad():
            out = module(*args)
        eager = (out[0] if isinstance(out, tuple | list) else out).numpy()
        via = interpret(export(module, args).graph, arrays)[0]
        rel_eager = float(np.abs(got - eager).max() / max(np.abs(eager).max(), 1e-12))
        rel_export = float(np.abs(got - via).max() / max(np.abs(via).max(), 1e-12))
        rows.append({"model": name, "rel_vs_eager": rel_eager, "rel_vs_export": rel_export, "import_s": seconds})
        worst = max(worst, rel_eager, rel_export)
        print(f"{name:<16}{rel_eager:>12.2e}{rel_export:>12.2e}{seconds:>10.2f}", flush=True)
    out_path = ROOT / "bench" / "results" / "onnx_zoo.json"
    out_path.write_text(json.dumps({"command": COMMAND + " --zoo", "models": rows}, indent=1))
    return 0 if worst <= 1e-4 else 1


def _resnet_behind_resize() -> Any:
    """resnet18 (zoo, torch.onnx.export) behind a Resize whose scales are a graph input: a value-deciding input."""
    import io

    import onnx
    import torch
    from onnx import TensorProto, helper

    import edgerun.zoo as zoo

    entry = zoo.get("resnet18")
    buf = io.BytesIO()
    torch.onnx.export(entry.build().eval(), tuple(entry.example_inputs()), buf, opset_version=17, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    g = model.graph
    image = g.input[0].name
    g.node.insert(0, helper.make_node("Resize", ["raw", "", "scales"], [image], mode="nearest"))
    del g.input[0]
    g.input.insert(0, helper.make_tensor_value_info("raw", TensorProto.FLOAT, [1, 3, 112, 112]))
    g.input.append(helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4]))
    return model


def value_cost(repeats: int = 3) -> int:
    """First-call and steady-state cost of a ValueTemplate against the same model frozen to one value."""
    import numpy as np

    import edgerun
    from edgerun.frontends.onnx import from_onnx

    def timed(fn: Any) -> tuple[float, Any]:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    load = os.getloadavg()[0]
    model = _resnet_behind_resize()
    x = np.random.default_rng(0).random((1, 3, 112, 112), dtype=np.float32)
    double, one_and_half = np.array([1, 1, 2, 2], np.float32), np.array([1, 1, 1.5, 1.5], np.float32)
    # Warm-up (imports, kernel caches) on a third value, so neither path below pays the process's cold start.
    edgerun.load(from_onnx(model, constant_inputs={"scales": np.ones(4, np.float32)}), backends=BACKENDS)(x)
    rows: dict[str, float] = {}
    rows["template import s"], template = timed(lambda: from_onnx(model))
    m = edgerun.load(template, backends=BACKENDS)
    rows["first call at scale 2 s"], got = timed(lambda: m(x, double))
    rows["steady call at scale 2 s"] = float(np.median([timed(lambda: m(x, double))[0] for _ in range(repeats)]))
    rows["first call at scale 1.5 s"], _ = timed(lambda: m(x, one_and_half))
    rows["static import s"], static = timed(lambda: from_onnx(model, constant_inputs={"scales": double}))
    rows["static load s"], loaded = timed(lambda: edgerun.load(static, backends=BACKENDS))
    rows["static first call s"], want = timed(lambda: loaded(x))
    rows["static steady call s"] = float(np.median([timed(lambda: loaded(x))[0] for _ in range(repeats)]))
    rows["static import+load+first call s"] = sum(rows[f"static {k} s"] for k in ("import", "load", "first call"))
    if not np.array_equal(got, want):
        raise SystemExit("the value template and the frozen program disagree")
    for name, seconds in rows.items():
        print(f"{name:<28}{seconds:>8.3f}")
    out = ROOT / "bench" / "results" / "onnx_value_inputs.json"
    out.write_text(json.dumps({"command": COMMAND + " --values", "model": "resnet18 behind Resize(scales input), "
                               f"backends {BACKENDS}", "load_average": load, "seconds": rows}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "onnx-conformance.md"))
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "onnx_conformance.json"))
    parser.add_argument("--zoo", action="store_true", help="check the zoo models instead of the node cases")
    parser.add_argument("--values", action="store_true",
                        help="time a value template (resnet18 behind Resize with a scales input) against the "
                             "same model frozen to one value")
    args = parser.parse_args()
    if args.zoo:
        return zoo_check()
    if args.values:
        return value_cost()
    load = os.getloadavg()[0]
    cases = node_cases()
    start = time.perf_counter()
    ours = run_cases(cases, edgerun_runner, progress=sys.stderr.isatty())
    seconds = {"edgerun": time.perf_counter() - start}
    start = time.perf_counter()
    sym = _symbolic_results(cases, {r.name: r for r in ours})
    seconds["symbolic"] = time.perf_counter() - start
    start = time.perf_counter()
    ort = _ort_results(cases, {r.name: r for r in ours})
    seconds["ort"] = time.perf_counter() - start
    Path(args.markdown).write_text(build_markdown(ours, ort, sym, seconds, load))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "command": COMMAND, "versions": versions(), "load_average": load, "seconds": seconds,
        "edgerun": totals(ours).__dict__, "onnxruntime": totals(ort).__dict__,
        "edgerun_symbolic_dims": totals(sym).__dict__,
        "cases": [{**r.to_json(), "ort_status": q.status, "symbolic_status": y.status,
                   "symbolic_detail": y.detail, "symbolic_value_inputs": y.value_inputs} for r, q, y in zip(ours, ort, sym)],
    }, indent=1))
    t, o, s = totals(ours), totals(ort), totals(sym)
    print(f"{'backend':<18}{'denominator':>12}{'passed':>8}{'rate':>8}{'refused':>9}{'error':>7}{'wrong':>7}")
    for name, x in (("edgerun", t), ("edgerun symbolic", s), ("onnxruntime", o)):
        print(f"{name:<18}{x.denominator:>12}{x.passed:>8}{x.pass_rate:>8.1%}{x.refused:>9}{x.error:>7}{x.wrong:>7}")
    return 0 if t.wrong == 0 and s.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
