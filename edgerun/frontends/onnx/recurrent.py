"""RNN, GRU and LSTM as one `scan` per direction: the recurrence is the scan's body, run once per time step.

The input projection of every time step is one matmul before the scan (its result is the scanned
sequence); the body adds the recurrent matmul and applies the gates. So the graph's size does not grow with
the sequence, and a symbolic sequence length (a template program) needs nothing more: the scan's length is
the symbol. Gate order follows the spec: LSTM i, o, f, c; GRU z, r, h. sequence_lens shorter than the
sequence is refused.

ONNX Runtime's DynamicQuantizeLSTM (com.microsoft, what its `quantize_dynamic` makes of an LSTM) is the same
LSTM with 8-bit weights stored transposed ([dir, input, 4H] and [dir, hidden, 4H]) and per-direction or
per-column scales and zero points. As ORT computes it, the activations are quantized at run time too: the
whole input sequence once (one uint8 scale and zero point, DynamicQuantizeLinear's), the hidden state at
every step row by row (each sequence of the batch its own scale); each product is an exact integer matmul
scaled back by the two scales.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph
from edgerun.ir.tensor_spec import TensorSpec

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}

Activation = Callable[[Builder, str], str]


def _activation(node: OnnxNode, name: str, clip: float | None) -> Activation:
    ops = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}
    op = ops.get(name.lower())
    if op is None:
        raise node.refuse(f"activation {name!r} (Sigmoid, Tanh and Relu are supported)")

    def apply(b: Builder, x: str) -> str:
        if clip is not None:
            x = b.emit("clamp", [x], min=-clip, max=clip)
        return b.emit(op, [x])
    return apply


def _slice(b: Builder, x: str, axis: int, start: int, stop: int) -> str:
    return b.emit("slice", [x], starts=[start], ends=[stop], axes=[axis])


def _reverse(b: Builder, x: str) -> str:
    """`x` with its leading axis reversed (the end clamps, so a symbolic length needs no arithmetic)."""
    return b.emit("slice", [x], starts=[-1], ends=[-(2 ** 62)], axes=[0], steps=[-1])


def _dequantized_matmul(b: Builder, x: str, w: str, w_scale: str, w_zp: str) -> str:
    """float32 x @ w for an 8-bit w: x quantized to uint8 at run time, an exact integer matmul, scaled back."""
    q, scale, zp = b.emit_multi("dynamic_quantize", [x], dtype="uint8")
    acc = b.emit("matmul_integer", [q, w, zp, w_zp])
    return b.emit("mul", [b.emit("cast", [acc], dtype="float32"), b.emit("mul", [scale, w_scale])])


def _row_quantized_matmul(b: Builder, h: str, w: str, w_scale: str, w_zp: str) -> str:
    """float32 h @ w for an 8-bit w, each row of h [batch, K] quantized to uint8 with its own scale and zero
    point (DynamicQuantizeLinear's rule: the row's range widened to include 0, 255 steps, zero point rounded
    half to even): ORT quantizes the hidden state row by row, so no sequence's range depends on another's."""
    low = b.emit("minimum", [b.emit("reduce_min", [h], axes=[1], keepdims=True), b.scalar(0.0, h)])
    high = b.emit("maximum", [b.emit("reduce_max", [h], axes=[1], keepdims=True), b.scalar(0.0, h)])
    span = b.emit("sub", [high, low])
    flat = b.emit("eq", [span, b.scalar(0.0, span)])
    scale = b.emit("where", [flat, b.scalar(1.0, span), b.emit("div", [span, b.scalar(255.0, span)])])
    zp = b.emit("round", [b.emit("clamp", [b.emit("neg", [b.emit("div", [low, scale])])], min=0.0, max=255.0)])
    q = b.emit("clamp", [b.emit("add", [b.emit("round", [b.emit("div", [h, scale])]), zp])], min=0.0, max=255.0)
    acc = b.emit("matmul_integer", [b.emit("cast", [q], dtype="uint8"), w, b.emit("cast", [zp], dtype="uint8"), w_zp])
    return b.emit("mul", [b.emit("cast", [acc], dtype="float32"), b.emit("mul", [scale, w_scale])])


def _step(b: Builder, node: OnnxNode, acts: list[Activation], hidden: int, h: str, c: str, xt: str, rt: str,
          rb: str, peep: str, r_quant: tuple[str, str] | None = None) -> tuple[str, str]:
    """One time step inside the scan body: (new h, new c ('' unless LSTM)) from the projected input xt;
    `r_quant`: the scale and zero point of an 8-bit recurrent weight rt (DynamicQuantizeLSTM)."""
    op = node.op_type

    def gate(k: int, src: str) -> str:
        return _slice(b, src, 1, k * hidden, (k + 1) * hidden)

    if op == "GRU":
        hr = b.emit("matmul", [h, rt])
        if rb:
            hr = b.emit("add", [hr, rb])
        z = acts[0](b, b.emit("add", [gate(0, xt), gate(0, hr)]))
        rr = acts[0](b, b.emit("add", [gate(1, xt), gate(1, hr)]))
        if node.attr("linear_before_reset", 0):
            cand_in = b.emit("mul", [rr, gate(2, hr)])
        else:
            rh = b.emit("matmul", [b.emit("mul", [rr, h]), gate(2, rt)])
            cand_in = b.emit("add", [rh, _slice(b, rb, 0, 2 * hidden, 3 * hidden)]) if rb else rh
        cand = acts[1](b, b.emit("add", [gate(2, xt), cand_in]))
        one_minus_z = b.emit("sub", [b.scalar(1.0, z), z])
        return b.emit("add", [b.emit("mul", [one_minus_z, cand]), b.emit("mul", [z, h])]), ""
    recurrent = _row_quantized_matmul(b, h, rt, *r_quant) if r_quant else b.emit("matmul", [h, rt])
    pre = b.emit("add", [xt, recurrent])
    if rb:
        pre = b.emit("add", [pre, rb])
    if op == "RNN":
        return acts[0](b, pre), ""

    def peeped(k: int, p: int, cell: str) -> str:
        v = gate(k, pre)
        return b.emit("add", [v, b.emit("mul", [_slice(b, peep, 0, p * hidden, (p + 1) * hidden), cell])]) \
            if peep else v
    i = acts[0](b, peeped(0, 0, c))
    f = acts[0](b, peeped(2, 2, c))
    if node.attr("input_forget", 0):
        f = b.emit("sub", [b.scalar(1.0, i), i])
    cand = acts[1](b, gate(3, pre))
    c = b.emit("add", [b.emit("mul", [f, c]), b.emit("mul", [i, cand])])
    o = acts[0](b, peeped(1, 1, c))
    return b.emit("mul", [o, acts[2](b, c)]), c


def _per_direction(ctx: ImportContext, node: OnnxNode, i: int, d: int) -> str:
    """DynamicQuantizeLSTM's scale or zero point i for direction d: 0-d, or [4H] per column."""
    v = ctx.input(node, i)
    shape = ctx.b.shape(v)
    if len(shape) == 1:
        return ctx.emit("reshape", [_slice(ctx.b, v, 0, d, d + 1)], shape=[])
    return ctx.emit("reshape", [_slice(ctx.b, v, 0, d, d + 1)], shape=[shape[-1]])


def _direction(ctx: ImportContext, node: OnnxNode, d: int, xs: str, hidden: int, acts: list[Activation],
               reverse: bool) -> tuple[str, str, str]:
    """Hidden states of every step (in time order, [seq, batch, hidden]), final h, final c ('' unless LSTM)."""
    op, g, b = node.op_type, GATES[node.op_type], ctx.b
    seq, batch, _ = b.shape(xs)
    quantized = node.domain == "com.microsoft"
    r_quant: tuple[str, str] | None = None
    if quantized:  # weights stored transposed and 8-bit
        w = ctx.emit("reshape", [_slice(b, ctx.input(node, 1), 0, d, d + 1)], shape=[-1, g * hidden])
        rt = ctx.emit("reshape", [_slice(b, ctx.input(node, 2), 0, d, d + 1)], shape=[hidden, g * hidden])
        proj = _dequantized_matmul(b, xs, w, _per_direction(ctx, node, 8, d), _per_direction(ctx, node, 9, d))
        r_quant = (_per_direction(ctx, node, 10, d), _per_direction(ctx, node, 11, d))
    else:
        w = ctx.emit("reshape", [_slice(b, ctx.input(node, 1), 0, d, d + 1)], shape=[g * hidden, -1])
        r = ctx.emit("reshape", [_slice(b, ctx.input(node, 2), 0, d, d + 1)], shape=[g * hidden, hidden])
        proj = ctx.emit("matmul", [xs, ctx.emit("transpose", [w], perm=[1, 0])])  # [seq, batch, g*hidden]
        rt = ctx.emit("transpose", [r], perm=[1, 0])
    rb = ""
    if node.has_input(3):
        bias = ctx.emit("reshape", [_slice(b, ctx.input(node, 3), 0, d, d + 1)], shape=[2 * g * hidden])
        wb, rb = _slice(b, bias, 0, 0, g * hidden), _slice(b, bias, 0, g * hidden, 2 * g * hidden)
        proj = ctx.emit("add", [proj, wb])
    if reverse:
        proj = _reverse(b, proj)

    def state(i: int) -> str:
        if node.has_input(i):
            return ctx.emit("reshape", [_slice(b, ctx.input(node, i), 0, d, d + 1)], shape=[batch, hidden])
        if isinstance(batch, int):
            return b.const(np.zeros((batch, hidden)), b.dtype(xs))
        return ctx.emit("expand", [b.const(np.zeros((1, hidden)), b.dtype(xs))], shape=[batch, hidden])

    carried = [state(5)] + ([state(6)] if op == "LSTM" else [])
    peep = ctx.emit("reshape", [_slice(b, ctx.input(node, 7), 0, d, d + 1)], shape=[3 * hidden]) \
        if op == "LSTM" and node.has_input(7) else ""
    invariants = [v for v in (rt, rb, peep, *(r_quant or ())) if v]

    body = Graph(symbols=dict(ctx.graph.symbols))
    bb = Builder(body, dict(b.meta))
    inner = {}
    for v in (*carried, "x_t", *invariants):
        spec = TensorSpec(b.shape(proj)[1:], b.dtype(proj)) if v == "x_t" else b.spec(v)
        if v in invariants and v in ctx.graph.constants:  # a weight: a constant of the body, so it folds there
            inner[v] = body.add_constant(ctx.graph.constants[v], hint="w")
        else:
            inner[v] = body.add_input(v, spec)
    h, c = _step(bb, node, acts, hidden, inner[carried[0]], inner[carried[1]] if op == "LSTM" else "", inner["x_t"],
                 inner[rt], inner.get(rb, ""), inner.get(peep, ""),
                 (inner[r_quant[0]], inner[r_quant[1]]) if r_quant else None)
    body.outputs = [h, *([c] if op == "LSTM" else []), h]
    operands = [v for v in invariants if v not in ctx.graph.constants]
    results = b.emit_multi("scan", [*carried, proj, *operands], body=add_subgraph(ctx.graph, body, "rnn"),
                           num_carried=len(carried), num_sequences=1, length=seq)
    ys = _reverse(b, results[-1]) if reverse else results[-1]
    return ys, results[0], results[1] if op == "LSTM" else ""


@onnx_op("RNN", "GRU", "LSTM", "com.microsoft:DynamicQuantizeLSTM")
def recurrent(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    if node.op_type == "DynamicQuantizeLSTM":  # an LSTM in every attribute; the domain marks its 8-bit weights
        node = dataclasses.replace(node, op_type="LSTM")
    x = ctx.input(node, 0)
    layout = int(node.attr("layout", 0))
    if len(ctx.b.shape(x)) != 3:
        raise ValueError(f"{node.op_type} input X must have 3 dimensions, got shape {ctx.b.shape(x)}")
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
        acts = [_activation(node, n, clip) for n in names[d * per_dir:(d + 1) * per_dir]]
        steps, h, c = _direction(ctx, node, d, x, hidden, acts, reverse)
        ys.append(ctx.emit("reshape", [steps], shape=[seq, 1, batch, hidden]))
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
