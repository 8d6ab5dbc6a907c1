"""RNN, GRU and LSTM, unrolled over the (static) sequence length into matmuls and elementwise gates.

The input projection of every time step is one matmul; each step then adds its recurrent matmul. Gate
order follows the spec: LSTM i, o, f, c; GRU z, r, h. sequence_lens shorter than the sequence is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _activation(ctx: ImportContext, node: OnnxNode, name: str, clip: float | None) -> Callable[[str], str]:
    ops = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}
    op = ops.get(name.lower())
    if op is None:
        raise node.refuse(f"activation {name!r} (Sigmoid, Tanh and Relu are supported)")

    def apply(x: str) -> str:
        if clip is not None:
            x = ctx.emit("clamp", [x], min=-clip, max=clip)
        return ctx.emit(op, [x])
    return apply


def _slice(ctx: ImportContext, x: str, axis: int, start: int, stop: int) -> str:
    return ctx.emit("slice", [x], starts=[start], ends=[stop], axes=[axis])


def _direction(ctx: ImportContext, node: OnnxNode, d: int, xs: str, hidden: int,
               acts: list[Callable[[str], str]], reverse: bool) -> tuple[list[str], str, str]:
    """Hidden states per step (in time order), final h, final c ('' unless LSTM) of direction d."""
    op, g = node.op_type, GATES[node.op_type]
    seq, batch, _ = ctx.b.shape(xs)
    w = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 1), 0, d, d + 1)], shape=[g * hidden, -1])
    r = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 2), 0, d, d + 1)], shape=[g * hidden, hidden])
    proj = ctx.emit("matmul", [xs, ctx.emit("transpose", [w], perm=[1, 0])])  # [seq, batch, g*hidden]
    rt = ctx.emit("transpose", [r], perm=[1, 0])
    rb = ""
    if node.has_input(3):
        bias = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 3), 0, d, d + 1)], shape=[2 * g * hidden])
        wb, rb = _slice(ctx, bias, 0, 0, g * hidden), _slice(ctx, bias, 0, g * hidden, 2 * g * hidden)
        proj = ctx.emit("add", [proj, wb])
    zeros = ctx.b.const(np.zeros((batch, hidden), dtype=ctx.b.dtype(xs).np))
    h = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 5), 0, d, d + 1)], shape=[batch, hidden]) \
        if node.has_input(5) else zeros
    c = ""
    if op == "LSTM":
        c = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 6), 0, d, d + 1)], shape=[batch, hidden]) \
            if node.has_input(6) else zeros
    peep = ctx.emit("reshape", [_slice(ctx, ctx.input(node, 7), 0, d, d + 1)], shape=[3 * hidden]) \
        if op == "LSTM" and node.has_input(7) else ""
    steps = range(seq - 1, -1, -1) if reverse else range(seq)
    outs: dict[int, str] = {}
    linear_before_reset = bool(node.attr("linear_before_reset", 0))
    for t in steps:
        xt = ctx.emit("reshape", [_slice(ctx, proj, 0, t, t + 1)], shape=[batch, g * hidden])

        def gate(k: int, src: str) -> str:
            return _slice(ctx, src, 1, k * hidden, (k + 1) * hidden)

        if op == "GRU":
            hr = ctx.emit("matmul", [h, rt])
            if rb:
                hr = ctx.emit("add", [hr, rb])
            z = acts[0](ctx.emit("add", [gate(0, xt), gate(0, hr)]))
            rr = acts[0](ctx.emit("add", [gate(1, xt), gate(1, hr)]))
            if linear_before_reset:
                cand_in = ctx.emit("mul", [rr, gate(2, hr)])
            else:
                rh = ctx.emit("matmul", [ctx.emit("mul", [rr, h]), gate(2, rt)])
                cand_in = ctx.emit("add", [rh, _slice(ctx, rb, 0, 2 * hidden, 3 * hidden)]) if rb else rh
            cand = acts[1](ctx.emit("add", [gate(2, xt), cand_in]))
            one_minus_z = ctx.emit("sub", [ctx.scalar(1.0, z), z])
            h = ctx.emit("add", [ctx.emit("mul", [one_minus_z, cand]), ctx.emit("mul", [z, h])])
        else:
            pre = ctx.emit("add", [xt, ctx.emit("matmul", [h, rt])])
            if rb:
                pre = ctx.emit("add", [pre, rb])
            if op == "RNN":
                h = acts[0](pre)
            else:
                def peeped(k: int, p: int, cell: str, pre: str = pre) -> str:
                    v = gate(k, pre)
                    return ctx.emit("add", [v, ctx.emit("mul", [_slice(ctx, peep, 0, p * hidden, (p + 1) * hidden),
                                                                cell])]) if peep else v
                i = acts[0](peeped(0, 0, c))
                f = acts[0](peeped(2, 2, c))
                if node.attr("input_forget", 0):
                    f = ctx.emit("sub", [ctx.scalar(1.0, i), i])
                cand = acts[1](gate(3, pre))
                c = ctx.emit("add", [ctx.emit("mul", [f, c]), ctx.emit("mul", [i, cand])])
                o = acts[0](peeped(1, 1, c))
                h = ctx.emit("mul", [o, acts[2](c)])
        outs[t] = h
    return [outs[t] for t in range(seq)], h, c


@onnx_op("RNN", "GRU", "LSTM")
def recurrent(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    layout = int(node.attr("layout", 0))
    if layout:
        x = ctx.emit("transpose", [x], perm=[1, 0, 2])
    seq, batch, _ = ctx.b.shape(x)
    lens = ctx.static(node, 4, "sequence_lens")
    if lens is not None and np.any(lens != seq):
        raise node.refuse("sequence_lens shorter than the sequence")
    hidden = int(node.attr("hidden_size"))
    direction = node.attr("direction", "forward")
    names = node.attr("activations") or DEFAULT_ACTS[node.op_type] * (2 if direction == "bidirectional" else 1)
    if node.attr("activation_alpha") or node.attr("activation_beta"):
        raise node.refuse("activation_alpha / activation_beta")
    clip = node.attr("clip")
    per_dir = len(DEFAULT_ACTS[node.op_type])
    dirs = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    ys, hs, cs = [], [], []
    for d, reverse in enumerate(dirs):
        acts = [_activation(ctx, node, n, clip) for n in names[d * per_dir:(d + 1) * per_dir]]
        steps, h, c = _direction(ctx, node, d, x, hidden, acts, reverse)
        ys.append(ctx.emit("concat", [ctx.emit("reshape", [s], shape=[1, 1, batch, hidden]) for s in steps], axis=0))
        hs.append(ctx.emit("reshape", [h], shape=[1, batch, hidden]))
        if c:
            cs.append(ctx.emit("reshape", [c], shape=[1, batch, hidden]))
    y = ctx.emit("concat", ys, axis=1)
    y_h = ctx.emit("concat", hs, axis=0)
    outs: list[Out] = [y, y_h]
    if cs:
        outs.append(ctx.emit("concat", cs, axis=0))
    if layout:
        outs[0] = ctx.emit("transpose", [y], perm=[2, 0, 1, 3])
        outs[1:] = [ctx.emit("transpose", [v], perm=[1, 0, 2]) for v in outs[1:] if isinstance(v, str)]
    return outs
