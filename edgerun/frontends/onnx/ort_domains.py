"""ONNX Runtime registers a few of its own ops in the default ONNX domain (SimplifiedLayerNormalization,
which its transformer optimizer emits for LLaMA-style models). ONNX's checker knows no such op there, so
before checking, those nodes are moved to com.microsoft, where edgerun's handler for them lives
(contrib_norms.py); the model's meaning is unchanged."""

from __future__ import annotations

from typing import Any

ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def move_ort_default_domain_ops(model: Any) -> Any:
    """The model with default-domain nodes of ORT's own ops (bodies included) in domain com.microsoft: a copy
    when there are any (the caller's ModelProto is left as it was), else the model itself."""
    import onnx
    from onnx import helper

    if not _uses(model.graph):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _move(copy.graph)
    if not any(o.domain == "com.microsoft" for o in copy.opset_import):
        copy.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return copy


def _subgraphs(node: Any) -> list[Any]:
    return [sub for a in node.attribute for sub in ((a.g, *a.graphs) if a.type in (5, 10) else ())]


def _uses(graph: Any) -> bool:
    return any((n.domain in ("", "ai.onnx") and n.op_type in ORT_DEFAULT_DOMAIN_OPS) or
               any(_uses(sub) for sub in _subgraphs(n)) for n in graph.node)


def _move(graph: Any) -> None:
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS:
            node.domain = "com.microsoft"
        for sub in _subgraphs(node):
            _move(sub)
