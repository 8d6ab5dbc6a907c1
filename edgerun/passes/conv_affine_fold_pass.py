"""ConvAffineFoldPass: fold per-channel mul/add/sub/div by constants after a conv2d into its weight and bias.

Decomposed batch norm is exactly `conv2d -> mul(scale[C,1,1]) -> add(shift[C,1,1])` once constant folding
has reduced the statistics to two vectors, so this pass is how batch norm disappears into the conv.
conv(x, W, b) * s = conv(x, W*s, b*s) and conv(x, W, b) + t = conv(x, W, b+t) hold per output channel, for
grouped and depthwise convs alike (each output channel owns one row of W). The conv output must have no
other reader and the weights no other user, or the fold would change other results or duplicate weights.
"""

from __future__ import annotations

import numpy as np

from edgerun.ir.graph import Graph, Node
from edgerun.passes.base import Pass, PassResult

_FOLDABLE = ("mul", "add", "sub", "div")


class ConvAffineFoldPass(Pass):
    """Fold per-channel affine ops by constants (batch norm) into the preceding conv2d's weight and bias."""

    name = "conv_affine_fold"

    def call(self, graph: Graph) -> PassResult:
        changed = False
        while self._fold_one(graph):
            changed = True
        graph.prune_specs()
        return PassResult(graph, changed)

    def _fold_one(self, graph: Graph) -> bool:
        consumers = graph.consumers()
        for conv in graph.nodes:
            if conv.op != "conv2d":
                continue
            users = consumers.get(conv.outputs[0], [])
            if len(users) != 1 or conv.outputs[0] in graph.outputs:
                continue
            user = users[0]
            per_channel = _per_channel_constant(graph, conv, user)
            if per_channel is None or not _owns_weights(graph, conv, consumers):
                continue
            dtype = graph.constants[conv.inputs[1]].dtype
            # In float64, so the fold itself adds no rounding beyond the final cast.
            weight = graph.constants[conv.inputs[1]].astype(np.float64)
            bias = graph.constants[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] \
                else np.zeros(weight.shape[0])
            if user.op in ("mul", "div"):
                factor = per_channel if user.op == "mul" else 1.0 / per_channel
                weight = weight * factor.reshape(-1, 1, 1, 1)
                bias = bias * factor
            else:
                bias = bias + per_channel if user.op == "add" else bias - per_channel
            w_name = graph.add_constant(weight.astype(dtype), hint="conv_w")
            b_name = graph.add_constant(bias.astype(dtype), hint="conv_b")
            conv.inputs = [conv.inputs[0], w_name, b_name]
            conv.outputs = list(user.outputs)  # the conv takes over the affine op's result name
            graph.nodes = [n for n in graph.nodes if n is not user]
            return True
        return False


def _per_channel_constant(graph: Graph, conv: Node, user: Node) -> np.ndarray | None:
    """The constant `user` applies to the conv output, as a vector over output channels, when it is one."""
    if user.op not in _FOLDABLE or len(user.inputs) != 2:
        return None
    y = conv.outputs[0]
    if user.inputs[0] == y:
        other = user.inputs[1]
    elif user.inputs[1] == y and user.op in ("mul", "add"):
        other = user.inputs[0]  # commutative ops only: s - y is not an affine fold of the bias
    else:
        return None
    if other not in graph.constants or graph.specs[user.outputs[0]] != graph.specs[y]:
        return None
    c = graph.constants[other]
    if c.ndim > 4 or c.dtype != graph.constants.get(conv.inputs[1], c).dtype:
        return None
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape)
    channels = graph.specs[y].shape[1]
    if c4.shape[0] != 1 or c4.shape[2] != 1 or c4.shape[3] != 1 or c4.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c4.reshape(-1), (channels,)).astype(np.float64)


def _owns_weights(graph: Graph, conv: Node, consumers: dict[str, list[Node]]) -> bool:
    weights = [v for v in conv.inputs[1:] if v]
    return all(v in graph.constants and len(consumers.get(v, [])) == 1 for v in weights) and \
        conv.inputs[1] in graph.constants
