"""The ONNX features edgerun refuses by design, and which of them a model uses.

A conformance case that needs one of these is left out of the denominator; everything else counts, and a
refusal there is a miss. The reasons are in docs/onnx.md.
"""

from __future__ import annotations

from typing import Any

from edgerun.frontends.onnx.context import ONNX_TO_DTYPE

DESIGN_CATEGORIES: dict[str, str] = {
    "training": "Gradient: the gradient of a graph needs automatic differentiation, which edgerun does not have",
    "other-domain": "ops outside the default ONNX domain, ai.onnx.ml and the preview domains",
    "map": "map values (ONNX maps from string or integer keys)",
    "random": "random generators (RandomNormal, Bernoulli, ...): the expected outputs are one draw of numpy's "
              "generator",
    "dtype": "element types edgerun does not hold: complex64/128 (no op computes on complex values): refused "
             "rather than silently cast",
}

# For each category: what would lift the refusal. "#12" is the dynamic shapes / state / control flow work
# (symbolic dimensions with bounds, persistent state, cond/while subgraph ops); the rest is either other
# work or truly out of reach.
DESIGN_OUTLOOK: dict[str, str] = {
    "training": "an autodiff pass over the IR (not planned). Adagrad, Adam and Momentum import as arithmetic "
                "(frontends/onnx/training.py)",
    "other-domain": "no node case uses one. FlexAttention (ai.onnx.preview) imports with its score_mod / "
                    "prob_mod graphs inlined (frontends/onnx/flex_attention.py); ai.onnx.ml's numeric ops "
                    "(frontends/onnx/ml.py) and LabelEncoder on strings (strings.py) import",
    "map": "no node case uses one. Sequences and optionals resolve at import into tensors "
           "(frontends/onnx/sequences.py); a map's keys could too, but its ops (ai.onnx.ml ZipMap, "
           "DictVectorizer, CastMap) take string keys",
    "random": "cannot be checked: every Bernoulli case draws its probabilities from (0, 1) and its expected "
              "output from numpy's global generator (onnx/backend/test/case/node/bernoulli.py, which says "
              "implementations differ even with a seed); no case has probabilities of only 0 and 1",
    "dtype": "complex values need complex kernels in every op: not planned. bfloat16, float8 (e8m0 included), "
             "float4, int4/uint4 and int2/uint2 are IR types backed by ml_dtypes (ir/dtypes.py); float64, int16, "
             "uint16, uint32 and uint64 are numpy's own",
}

_TRAINING = {"Gradient"}  # Adam, Adagrad and Momentum import (training.py)
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}


def _value_kinds(model: Any) -> tuple[set[str], set[int]]:
    kinds, elem = set(), set()
    g = model.graph
    for vi in (*g.input, *g.output):
        kind = vi.type.WhichOneof("value")
        kinds.add(kind or "none")
        if kind == "tensor_type":
            elem.add(vi.type.tensor_type.elem_type)
    for t in g.initializer:
        elem.add(t.data_type)
    return kinds, elem


def design_category(model: Any) -> str | None:
    """The first refused-by-design category a model falls in, or None when it should import."""
    ops = {n.op_type for n in model.graph.node}
    domains = {n.domain for n in model.graph.node} - {"", "ai.onnx"}
    kinds, elem = _value_kinds(model)
    if ops & _TRAINING:
        return "training"
    if domains - {"ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"}:  # ml.py, strings.py, training.py
        return "other-domain"
    if kinds - {"tensor_type", "sequence_type", "optional_type"}:  # sequences and optionals: sequences.py
        return "map"
    if ops & _RANDOM:
        return "random"
    if elem - set(ONNX_TO_DTYPE) - {0}:
        return "dtype"
    return None
