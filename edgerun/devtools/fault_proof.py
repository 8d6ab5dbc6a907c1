"""The fault-injection proof: for each injected bug, do random unit tests catch it, do carved tests catch it,
and does `migrate` name the faulty op?

The proof model is a small token-feature classifier with every op a bug lives in: an int8 weight dequantised
in the graph, GELU (tanh form), a SiLU gate, an RMS normalisation over all 4096 activations (a long
reduction), masked softmax attention pooling (exp), and a transpose (a strided raster). Its realistic inputs
are padded sequences of token features with a few outlier channels of magnitude 20-40, the activation
outliers transformers really have (Dettmers et al., LLM.int8(), 2022); random unit tests draw U(-1, 1), as
unit-test authors do. The same functions run on zoo programs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgerun.backends.faulty import FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.devtools.bundle import TestBundle
from edgerun.devtools.carve import carve
from edgerun.devtools.check import check_bundle
from edgerun.devtools.migrate import migrate
from edgerun.devtools.programs import InputSet, LoadedGraph, load_graph
from edgerun.devtools.random_tests import random_unit_tests
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec

TOKENS, FEATURES, HIDDEN, CLASSES = 32, 64, 128, 10
OUTLIER_CHANNELS = (3, 17, 42)


def proof_model(seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g, {"module_path": "proof_model"})
    x = g.add_input("features", TensorSpec((1, TOKENS, FEATURES), DType.float32))
    mask = g.add_input("mask", TensorSpec((1, TOKENS), DType.int64))  # 1: a real token, 0: padding

    def weight(*shape: int, std: float = 0.25) -> str:
        return b.const(rng.normal(0, std, shape).astype(np.float32))
    w1 = rng.normal(0, 0.25, (FEATURES, HIDDEN))
    scale = np.abs(w1).max(axis=0) / 127
    w1_q = b.const(np.round(w1 / scale).astype(np.int8), hint="w1_int8")
    w1_f = b.binary("mul", b.emit("cast", [w1_q], dtype="float32"), b.const(scale.astype(np.float32)))
    h = b.binary("add", b.emit("matmul", [x, w1_f]), weight(HIDDEN, std=0.1))
    act = b.emit("gelu", [h], approximate="tanh")
    gate = b.emit("silu", [b.emit("matmul", [x, weight(FEATURES, HIDDEN)])])
    m = b.binary("mul", act, gate)
    ms = b.emit("reduce_mean", [b.binary("mul", m, m)], axes=[1, 2], keepdims=True)
    n = b.binary("mul", m, b.unary("rsqrt", b.binary("add", ms, b.scalar(1e-5, ms))))
    # Attention pooling over the real tokens: padding gets a -1e9 bias, as transformer masks do.
    scores = b.emit("reshape", [b.emit("matmul", [n, weight(HIDDEN, 1, std=0.1)])], shape=[1, TOKENS])
    pad = b.binary("sub", b.scalar(1.0, scores), b.emit("cast", [mask], dtype="float32"))
    weights = b.emit("softmax", [b.binary("add", scores, b.binary("mul", pad, b.scalar(-1e9, scores)))], axis=-1)
    t = b.emit("transpose", [n], perm=[0, 2, 1])  # [1, HIDDEN, TOKENS]
    pooled = b.emit("matmul", [t, b.emit("reshape", [weights], shape=[1, TOKENS, 1])])
    g.outputs = [b.emit("matmul", [b.emit("reshape", [pooled], shape=[1, HIDDEN]), weight(HIDDEN, CLASSES, std=0.1)])]
    return g


def realistic_inputs(count: int = 2, seed: int = 1) -> list[InputSet]:
    """Padded token features: N(0, 1) with outlier channels of magnitude 20-40 (signs vary per token), the
    first 20-30 of 32 positions real and the rest zero padding with mask 0."""
    rng = np.random.default_rng(seed)
    sets: list[InputSet] = []
    for _ in range(count):
        x = rng.normal(0, 1, (1, TOKENS, FEATURES))
        for c in OUTLIER_CHANNELS:
            x[0, :, c] = rng.uniform(20, 40, TOKENS) * rng.choice([-1, 1], TOKENS)
        length = int(rng.integers(20, 31))
        x[0, length:] = 0
        mask = (np.arange(TOKENS) < length).astype(np.int64)[None]
        sets.append({"features": x.astype(np.float32), "mask": mask})
    return sets


@dataclass
class FaultRow:
    bug: str
    random_caught: bool
    random_failing_ops: list[str]
    carved_caught: bool
    carved_failing_ops: list[str]
    migrate_named: str | None  # the unit migrate stopped at
    migrate_stage: str | None  # "op" or "model"
    model_runs: int
    seconds: float  # migrate's wall time, carving excluded

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def fault_row(loaded: LoadedGraph, input_sets: Sequence[InputSet], bug: str, carved: TestBundle | None = None,
              random_bundle: TestBundle | None = None) -> FaultRow:
    faulty = FaultyBackend(bug)
    carved = carved if carved is not None else carve(loaded, input_sets)
    random_bundle = random_bundle if random_bundle is not None else random_unit_tests(loaded.graph)
    rnd = check_bundle(random_bundle, faulty)
    cvd = check_bundle(carved, faulty)
    start = time.perf_counter()
    report = migrate(loaded, input_sets, carved, get_backend("reference"), faulty)
    seconds = time.perf_counter() - start
    failed = report.failed
    return FaultRow(bug, not rnd.passed, sorted({r.case.op for r in rnd.failures}), not cvd.passed,
                    sorted({r.case.op for r in cvd.failures}), failed.unit if failed else None,
                    None if failed is None else ("op" if not failed.op_passed else "model"),
                    report.model_runs, seconds)


def proof_table(rows: Sequence[FaultRow], expected_op: dict[str, str] | None = None) -> str:
    """Markdown; a bug the model's inputs never trigger (no check fails, migration passes) says so."""
    lines = ["| bug | faulty op | caught by random unit tests? | caught by carved tests? | migrate names | "
             "model runs | migrate time (s) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        op = (expected_op or {}).get(r.bug, "")
        triggered = r.random_caught or r.carved_caught or r.migrate_named is not None
        random = "yes" if r.random_caught else ("**no**" if r.carved_caught else "no")
        named = f"`{r.migrate_named}` ({r.migrate_stage} check)" if r.migrate_named else \
            ("nothing" if triggered else "nothing: these inputs never take the faulty path")
        lines.append(f"| {r.bug} | `{op}` | {random} | {'yes' if r.carved_caught else 'no'} | {named} | "
                     f"{r.model_runs} | {r.seconds:.2f} |")
    return "\n".join(lines)


FAULTY_OP = {"tanh_nan": "tanh", "dequant_uint8": "cast", "fp16_reduce": "reduce_mean",
             "raster_stride": "raster", "exp_range": "exp", "sigmoid_range": "sigmoid"}


def proof_loaded() -> LoadedGraph:
    return load_graph(proof_model())
