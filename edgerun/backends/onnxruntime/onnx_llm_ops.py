"""The composites of transformer decoders as ONNX Runtime's fused kernels (one node where the IR's
decomposition would make several).

rms_norm -> SimplifiedLayerNormalization (ORT's RMSNorm, registered in the default ONNX domain): one kernel
instead of the six nodes of its decomposition (Mul, ReduceMean, Add, Sqrt, Reciprocal, Mul, then the
weight's Mul). A decoder layer has two, so a 30-layer LLM step loses about 300 nodes. (The ORT profile shows the
residual Add before one not fused into SkipSimplifiedLayerNormalization on the LLM's 2-D [tokens, dim]
activations; ORT's skip-norm fusion looks for 3-D ones.) Claimed only with a weight shaped like the normalised axes
(ORT's `scale` input is required and not broadcast); otherwise the IR's decomposition runs.
"""

from __future__ import annotations

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.backends.onnxruntime.onnx_ops import COMPOSITES, TRANSLATORS, OnnxBuilder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node


def _rms_norm_fits(node: Node, graph: Graph) -> bool:
    x = graph.specs[node.inputs[0]].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    return weight is None or graph.specs[weight].shape == x[len(x) - n:]


def _rms_norm(b: OnnxBuilder, node: Node) -> None:
    x = node.inputs[0]
    shape = b.graph.specs[x].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else \
        b.const(np.ones(shape[len(shape) - n:], np.float32), "rms_scale")
    b.node("SimplifiedLayerNormalization", [x, weight], list(node.outputs), axis=len(shape) - n,
           epsilon=float(node.attrs.get("eps", 1e-6)))


TRANSLATORS["rms_norm"] = _rms_norm
COMPOSITES["rms_norm"] = OpSupport(dtypes=frozenset({DType.float32}), check=_rms_norm_fits)
