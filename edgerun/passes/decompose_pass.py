"""DecomposePass: replace composite ops by their registered decompositions (edgerun.ir.decompose).

Export keeps the composites a backend may implement whole (`PROGRAM_COMPOSITES`): the program file stays
portable, and at load each backend claims the ones it runs as one kernel (Backend.composites); the runtime
decomposes the rest after placement. Everything else is lowered here, because later passes need the pieces:
linear (its weight transpose folds into the stored weight), batch norm (folds into the conv before it), the
layout ops (rasters merge), attention (its transposes merge with the head split around it).
"""

from __future__ import annotations

from collections.abc import Collection

from edgerun.ir.decompose import decompose
from edgerun.ir.graph import Graph
from edgerun.passes.base import Pass, PassResult

# Composites kept in program files: activations, normalisations, resizes and transposed convolutions that
# fast engines have single kernels for.
PROGRAM_COMPOSITES = frozenset({"relu", "clamp", "gelu", "silu", "softmax", "log_softmax", "layer_norm",
                                "rms_norm", "resize", "conv_transpose2d"})


class DecomposePass(Pass):
    """Lower composite ops to atomic ops and raster, except those named in `keep`."""

    name = "decompose"

    def __init__(self, keep: Collection[str] = ()) -> None:
        self.keep = frozenset(keep)

    def call(self, graph: Graph) -> PassResult:
        keep = self.keep
        return PassResult(graph, decompose(graph, (lambda node, _: node.op in keep) if keep else None))
