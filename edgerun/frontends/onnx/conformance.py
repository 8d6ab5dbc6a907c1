"""Run ONNX's node test cases against a backend and classify each: pass, refused, error, wrong, or by design.

- pass: outputs match in count, shape, dtype and value (the ONNX runner's rtol/atol per case).
- refused: the import or run raised a deliberate EdgerunError (UnsupportedOpError, a malformed model, ...).
- error: any other exception, including OnnxImportError (our shapes disagreeing with ONNX's): a bug.
- wrong: outputs came back and differ: a silent wrong answer, the one outcome we must never have.
- design:<category>: the case needs a feature refused by design (categories.py); not in the denominator.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.frontends.onnx.categories import design_category
from edgerun.frontends.onnx.importer import OnnxImportError

Runner = Callable[[Any, list[np.ndarray]], list[np.ndarray]]


@dataclass
class CaseResult:
    name: str
    op: str
    status: str  # pass | refused | error | wrong | design
    category: str = ""
    value_inputs: str = ""  # inputs the imported program specialised on by value at call time (value_template.py)
    detail: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_cases() -> list[Any]:
    """ONNX's node test cases, generated from the installed onnx package (no files, no network)."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases(None) if c.kind == "node" and c.data_sets]


def _snake(op: str) -> str:
    out = []
    for i, ch in enumerate(op):
        if ch.isupper() and i and (not op[i - 1].isupper() or (i + 1 < len(op) and op[i + 1].islower())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def case_op(case: Any) -> str:
    """The op a case tests: its node's op, or for expanded multi-node cases the op its name starts with."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return str(nodes[0].op_type)
    import onnx.defs
    name = case.name.removeprefix("test_")
    best = ""
    for schema in onnx.defs.get_all_schemas():
        snake = _snake(schema.name)
        if (name == snake or name.startswith(snake + "_")) and len(snake) > len(_snake(best) if best else ""):
            best = schema.name
    return best or str(nodes[-1].op_type)


class EdgerunRunner:
    """Runs a case through EdgerunBackend and remembers which inputs its program specialised on by value.

    With `symbolic_dims` every input dimension is a bounded symbol: one template imported for every shape,
    specialised to the case's shapes at run time (backend.py).
    """

    def __init__(self, symbolic_dims: bool = False) -> None:
        self.symbolic_dims = symbolic_dims
        self.value_inputs: tuple[str, ...] = ()

    def __call__(self, model: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
        from edgerun.frontends.onnx.backend import EdgerunBackend
        self.value_inputs = ()
        rep = EdgerunBackend.prepare(model, symbolic_dims=self.symbolic_dims)
        self.value_inputs = rep.value_inputs
        return list(rep.run(inputs))


edgerun_runner = EdgerunRunner()
symbolic_runner = EdgerunRunner(symbolic_dims=True)


def ort_runner(model: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if model.ir_version > 10:  # this onnxruntime reads IR <= 10; the node cases need nothing newer
        import onnx
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return list(sess.run(None, dict(zip(names, inputs))))


def compare(case: Any, got: list[np.ndarray], want: list[np.ndarray]) -> str:
    """'' when outputs match as ONNX's runner checks them, else the first difference."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list) or w is None or isinstance(g, list) or g is None:
            # a sequence output (a list of tensors) or an empty optional (None), as ONNX's runner compares them
            if type(g) is not type(w):
                return f"output {i} is {type(g).__name__}, expected {type(w).__name__}"
            if w is not None:
                diff = compare(case, list(g), list(w))
                if diff:
                    return f"output {i} element {diff}"
            continue
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"output {i} shape {g.shape}, expected {w.shape}"
        if g.dtype != w.dtype:
            return f"output {i} dtype {g.dtype}, expected {w.dtype}"
        try:
            if w.dtype == object:  # strings compare exactly, as ONNX's runner compares them
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
        except AssertionError as exc:
            return f"output {i}: {str(exc).strip().splitlines()[2] if len(str(exc).splitlines()) > 2 else exc}"
    return ""


def run_case(case: Any, runner: Runner = edgerun_runner, refusal: tuple[type[BaseException], ...] = (EdgerunError,),
             honour_design: bool = True) -> CaseResult:
    op = case_op(case)
    category = design_category(case.model) if honour_design else None
    if category:
        return CaseResult(case.name, op, "design", category)
    start = time.perf_counter()
    try:
        for inputs, outputs in case.data_sets:
            with np.errstate(all="ignore"):
                got = runner(case.model, [_array(v) for v in inputs])
            diff = compare(case, got, [_array(v) for v in outputs])
            if diff:
                return CaseResult(case.name, op, "wrong", detail=diff, seconds=time.perf_counter() - start,
                                  value_inputs=_value_inputs(runner))
    except OnnxImportError as exc:
        return CaseResult(case.name, op, "error", detail=str(exc)[:300], seconds=time.perf_counter() - start)
    except refusal as exc:
        return CaseResult(case.name, op, "refused", detail=str(exc)[:300], seconds=time.perf_counter() - start)
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{type(exc).__name__}: {str(exc)[:240]} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return CaseResult(case.name, op, "error", detail=detail, seconds=time.perf_counter() - start)
    return CaseResult(case.name, op, "pass", seconds=time.perf_counter() - start, value_inputs=_value_inputs(runner))


def _value_inputs(runner: Runner) -> str:
    return ",".join(getattr(runner, "value_inputs", ()))


def _array(v: Any) -> Any:
    """A case's value as numpy: sequences stay lists of arrays, an empty optional None."""
    if v is None:
        return None
    if isinstance(v, list):
        return [_array(e) for e in v]
    if hasattr(v, "SerializeToString"):
        from onnx import numpy_helper
        return numpy_helper.to_array(v)
    return np.asarray(v)


def run_cases(cases: Iterable[Any], runner: Runner = edgerun_runner, refusal: tuple[type[BaseException], ...] = (EdgerunError,),
              progress: bool = False) -> list[CaseResult]:
    cases = list(cases)
    if progress:
        from tqdm import tqdm
        cases = list(tqdm(cases, desc="onnx node cases", unit="case", leave=False))
    return [run_case(c, runner, refusal) for c in cases]


@dataclass
class Totals:
    cases: int
    design: int
    denominator: int
    passed: int
    refused: int
    error: int
    wrong: int

    @property
    def pass_rate(self) -> float:
        return self.passed / self.denominator if self.denominator else 0.0


def totals(results: list[CaseResult]) -> Totals:
    c = Counter(r.status for r in results)
    design = c["design"]
    return Totals(len(results), design, len(results) - design, c["pass"], c["refused"], c["error"], c["wrong"])
