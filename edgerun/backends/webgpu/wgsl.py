"""WGSL for every atomic op and raster, generated per node with its static shapes baked in as constants.

Every kernel has one thread per output element: it computes `acc`, the node's value at flat output index
`idx`, and the fusion pass (lowering.py) may append elementwise ops before the stores. On
the device float32 is `f32`, float16 `f16` (computed in f32; only on adapters with `shader-f16`), int32 and
int64 are `i32` (WGSL has no 64-bit integers; int64 values are range-checked on upload), bool is `u32` 0/1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry, pool_geometry

WORKGROUP = 64
# What kernels compute in, and what buffers hold: float16 is stored as f16 and computed in f32 (a load
# widens, a store rounds once), so a fused chain rounds to half precision once, at its end.
# uint8 here is matmul_int4's packed constants, bound as u32 words; the quantized ops' int8/uint8 values are int8.py's.
WGSL_TYPE = {DType.float32: "f32", DType.float16: "f32", DType.int32: "i32", DType.int64: "i32", DType.bool: "u32",
             DType.uint8: "u32"}
STORAGE_TYPE = {**WGSL_TYPE, DType.float16: "f16"}
FLOATS = frozenset({DType.float32, DType.float16})
STATUS_SCATTER_RANGE = 3  # the status word's value when a scatter_add index is out of range (1: gather's)


def literal(value: Any, dtype: DType) -> str:
    """A WGSL constant of `dtype`; infinities and NaN through e_bits (WGSL has no literal for them)."""
    if dtype in FLOATS:
        v = float(value)
        if math.isnan(v):
            return "e_bits(0x7fc00000u)"
        if math.isinf(v):
            return "e_bits(0x7f800000u)" if v > 0 else "e_bits(0xff800000u)"
        return f"f32({v!r})"
    if dtype is DType.bool:
        return "1u" if value else "0u"
    return f"i32({int(value)})"

# Helpers every shader may call; the WGSL compiler drops the unused ones.
PRELUDE = """
fn e_tanh(x: f32) -> f32 { let e = exp(-2.0 * abs(x)); return sign(x) * (1.0 - e) / (1.0 + e); }
fn e_sigmoid(x: f32) -> f32 { if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); } let e = exp(x); return e / (1.0 + e); }
fn e_erf(x: f32) -> f32 {
  // W. J. Cody's rational approximations through erfc for |x| >= 0.5, a series below: ~1 ulp in f32.
  let a = abs(x);
  if (a < 0.5) {
    let t = x * x;
    return x * (1.1283791671 + t * (-0.3761263890 + t * (0.1128379167 + t * (-0.0268661706
           + t * (0.0052239776 + t * (-0.0008548327 + t * 0.0001205493))))));
  }
  let t = 1.0 / (1.0 + 0.5 * a);
  let y = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
          + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
  return sign(x) * (1.0 - y);
}
fn e_pow(a: f32, b: f32) -> f32 {
  if (b == 0.0) { return 1.0; }
  if (a == 0.0) { if (b > 0.0) { return 0.0; } return e_bits(0x7f800000u); }
  if (a > 0.0) { return exp2(b * log2(a)); }
  if (b != floor(b)) { return e_bits(0x7fc00000u); }
  let m = exp2(b * log2(-a));
  if (abs(b - 2.0 * floor(b * 0.5)) == 1.0) { return -m; }
  return m;
}
// Infinities and NaN from their bits, through a function so no compiler constant-evaluates them (naga refuses
// 1.0/0.0, and Chrome's Tint refuses bitcast<f32>(0x7f800000u) as a constant: "inf cannot be represented").
fn e_bits(b: u32) -> f32 { return bitcast<f32>(b); }
// NaN tests on the bits: shader compilers may assume x == x.
fn e_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn e_max(a: f32, b: f32) -> f32 { if (e_isnan(a)) { return a; } if (e_isnan(b)) { return b; } return max(a, b); }
fn e_min(a: f32, b: f32) -> f32 { if (e_isnan(a)) { return a; } if (e_isnan(b)) { return b; } return min(a, b); }
fn e_cast_i32(x: f32) -> i32 {
  if (e_isnan(x)) { return 0; }
  if (x >= 2147483520.0) { return 2147483647; }
  if (x <= -2147483648.0) { return -2147483647 - 1; }
  return i32(trunc(x));
}
"""

FLOAT_UNARY = {
    "exp": "exp({0})", "log": "log({0})", "sqrt": "sqrt({0})", "rsqrt": "inverseSqrt({0})",
    "tanh": "e_tanh({0})", "sigmoid": "e_sigmoid({0})", "erf": "e_erf({0})", "sin": "sin({0})",
    "cos": "cos({0})", "floor": "floor({0})", "ceil": "ceil({0})", "round": "round({0})", "neg": "(-{0})",
    "abs": "abs({0})", "sign": "sign({0})", "reciprocal": "(1.0 / {0})",
}
INT_UNARY = {"neg": "(-{0})", "abs": "abs({0})", "sign": "sign({0})"}
_ARITH = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})"}
_FLOAT_BINARY = {**_ARITH, "maximum": "e_max({0}, {1})", "minimum": "e_min({0}, {1})", "pow": "e_pow({0}, {1})"}
_INT_BINARY = {**_ARITH, "maximum": "max({0}, {1})", "minimum": "min({0}, {1})"}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
LOGICAL = {"logical_and": "({0} & {1})", "logical_or": "({0} | {1})", "logical_xor": "({0} ^ {1})"}

ELEMENTWISE = {*FLOAT_UNARY, *INT_UNARY, *_FLOAT_BINARY, *COMPARE, *LOGICAL, "div", "mod", "logical_not",
               "where", "cast"}
REDUCE = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"}


def elementwise_expr(node: Node, graph: Graph, args: Sequence[str]) -> str:
    """The WGSL expression of one elementwise node over argument expressions `args`."""
    op = node.op
    in_dt = graph.specs[node.inputs[-1]].dtype
    out_dt = graph.specs[node.outputs[0]].dtype
    is_float = in_dt in FLOATS
    if op == "cast":
        src = graph.specs[node.inputs[0]].dtype
        if out_dt is DType.bool:
            if src in FLOATS:  # NaN is true; the bit test because compilers may fold x != 0 for NaN
                return f"select(0u, 1u, {args[0]} != 0.0 || e_isnan({args[0]}))"
            return f"select(0u, 1u, {args[0]} != {'0u' if src is DType.bool else '0'})"
        if WGSL_TYPE[src] == WGSL_TYPE[out_dt]:  # int32 <-> int64, float16 <-> float32 (both computed in f32)
            return args[0]
        if out_dt in FLOATS:
            return f"f32({args[0]})"
        return f"e_cast_i32({args[0]})" if src in FLOATS else f"i32({args[0]})"
    if op == "where":
        return f"select({args[2]}, {args[1]}, {args[0]} != 0u)"
    if op == "logical_not":
        return f"(1u - {args[0]})"
    if op in LOGICAL:
        return LOGICAL[op].format(*args)
    if op == "ne" and is_float:
        return f"select(0u, 1u, {args[0]} != {args[1]} || e_isnan({args[0]}) || e_isnan({args[1]}))"
    if op in COMPARE:
        return f"select(0u, 1u, {args[0]} {COMPARE[op]} {args[1]})"
    if op == "div":
        q = f"({args[0]} / {args[1]})"
        rounding = node.attrs.get("rounding", "none")
        return f"floor{q}" if rounding == "floor" else f"trunc{q}" if rounding == "trunc" else q
    if op == "mod":
        a, b = args
        return f"({a} - {b} * trunc({a} / {b}))" if node.attrs.get("fmod") else \
            f"e_pymod({a}, {b})"
    table: dict[str, str] = (FLOAT_UNARY if is_float else INT_UNARY) if len(args) == 1 else \
        (_FLOAT_BINARY if is_float else _INT_BINARY)
    return table[op].format(*args)


PYMOD = """
fn e_pymod(a: f32, b: f32) -> f32 {
  let r = a - b * trunc(a / b);
  if (r != 0.0 && ((r < 0.0) != (b < 0.0))) { return r + b; }
  return r;
}
"""


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a row-major `shape` read at `out_shape`'s coordinates (numpy broadcasting)."""
    strides = [0] * len(out_shape)
    step = 1
    for k in range(1, len(shape) + 1):
        d = shape[-k]
        if d != 1:
            strides[-k] = step
        step *= d
    return strides


def coords(shape: Sequence[int], var: str = "idx", prefix: str = "c") -> list[str]:
    """Lines declaring `{prefix}{axis}` = the coordinate of flat index `var` along each axis of `shape`."""
    lines, step = [], 1
    for axis in range(len(shape) - 1, -1, -1):
        lines.append(f"let {prefix}{axis} = i32(({var} / {step}u) % {max(shape[axis], 1)}u);")
        step *= max(shape[axis], 1)
    return lines


def offset_expr(strides: Sequence[int], prefix: str = "c", base: int | str = 0) -> str:
    terms = [str(base)] if base != 0 else []
    terms += [f"{prefix}{a} * {s}" for a, s in enumerate(strides) if s]
    return " + ".join(terms) or "0"


@dataclass
class Kernel:
    """One dispatch: WGSL source, the values bound (binding k = values[k]), threads and region parameters."""

    source: str
    values: list[str]  # bound in order; the last `n_outputs` are written
    threads: int
    nodes: list[str]
    params: np.ndarray | None = None  # an extra i32 storage buffer bound after the values (raster regions)
    label: str = ""
    n_outputs: int = 1
    status: bool = False  # binds the partition's status word (set to 1 on bad input, e.g. a gather index)


@dataclass
class Body:
    """What one node's kernel contributes: the bound inputs and the lines computing `acc` at `idx`."""

    inputs: list[str]
    lines: list[str]
    params: np.ndarray | None = None


def row_major(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


def node_body(node: Node, graph: Graph, int4_half: bool = False) -> Body:
    """The lines computing `acc` for output flat index `idx` (inputs are bound as in0, in1, ...);
    `int4_half`: matmul_int4 accumulates in f16 (the caller checked the adapter's shader-f16)."""
    op = node.op
    out = graph.specs[node.outputs[0]]
    ins = [graph.specs[v] for v in node.inputs if v]
    inputs = [v for v in node.inputs if v]
    if op in ELEMENTWISE:
        lines = coords(out.shape)
        args = []
        for k, spec in enumerate(ins):
            args.append(f"in{k}[{offset_expr(broadcast_strides(spec.shape, out.shape))}]")
        return Body(inputs, [*lines, f"let acc = {elementwise_expr(node, graph, args)};"])
    if op in REDUCE:
        return _reduce_body(node, graph, inputs)
    if op in ("argmax", "argmin"):
        return _arg_body(node, graph, inputs)
    if op == "matmul":
        return _matmul_body(graph, inputs, out.shape)
    if op == "matmul_int4":
        return _matmul_int4_body(node, graph, inputs, int4_half)
    if op == "softmax":
        return _softmax_body(node, graph, inputs)
    if op == "rms_norm":
        return _rms_norm_body(node, graph, inputs)
    if op == "layer_norm":
        return _layer_norm_body(node, graph, inputs)
    if op == "conv2d":
        return _conv_body(node, graph, inputs)
    if op in ("max_pool2d", "avg_pool2d"):
        return _pool_body(node, graph, inputs)
    if op == "gather":
        return _gather_body(node, graph, inputs)
    if op == "update_slice":
        return _update_slice_body(node, graph, inputs)
    if op == "scatter_add":
        return _scatter_add_body(node, graph, inputs)
    raise KeyError(op)


def _reduce_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    x = graph.specs[inputs[0]]
    axes_attr = node.attrs.get("axes")
    rank = max(x.rank, 1)
    axes = sorted(range(x.rank)) if axes_attr is None else sorted({int(a) % rank for a in axes_attr})
    kept = [a for a in range(x.rank) if a not in axes]
    strides = row_major(x.shape)
    t = WGSL_TYPE[x.dtype]
    lines = coords([x.shape[a] for a in kept], prefix="k")
    base = " + ".join([f"k{i} * {strides[a]}" for i, a in enumerate(kept)]) or "0"
    count = math.prod(x.shape[a] for a in axes)
    red_shape = [x.shape[a] for a in axes]
    red = coords(red_shape, "r", "q")
    roff = " + ".join(f"q{i} * {strides[a]}" for i, a in enumerate(axes)) or "0"
    op = node.op
    if op in ("reduce_sum", "reduce_mean"):
        init = "0.0" if t == "f32" else "0"
        step = "acc_r = acc_r + v;"
    else:
        init = "in0[base]"
        f = "max" if op == "reduce_max" else "min"
        step = f"acc_r = e_{f}(acc_r, v);" if t == "f32" else f"acc_r = {f}(acc_r, v);"
    lines += [f"let base = {base};", f"var acc_r: {t} = {init};",
              f"for (var r: u32 = 0u; r < {count}u; r = r + 1u) {{", *red,
              f"  let v = in0[base + {roff}];", f"  {step}", "}"]
    lines.append(f"let acc = acc_r / {float(count)!r};" if op == "reduce_mean" else "let acc = acc_r;")
    return Body(inputs, lines)


def _arg_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    x = graph.specs[inputs[0]]
    axis = int(node.attrs.get("axis", 0)) % max(x.rank, 1)
    strides = row_major(x.shape)
    kept = [a for a in range(x.rank) if a != axis]
    lines = coords([x.shape[a] for a in kept], prefix="k")
    base = " + ".join(f"k{i} * {strides[a]}" for i, a in enumerate(kept)) or "0"
    cmp = ">" if node.op == "argmax" else "<"
    if node.attrs.get("select_last_index"):
        cmp += "="
    lines += [f"let base = {base};", "var best = in0[base];", "var best_i: i32 = 0;",
              f"for (var r: i32 = 1; r < {x.shape[axis]}; r = r + 1) {{",
              f"  let v = in0[base + r * {strides[axis]}];",
              f"  if (v {cmp} best) {{ best = v; best_i = r; }}", "}", "let acc = best_i;"]
    return Body(inputs, lines)


def _matmul_body(graph: Graph, inputs: list[str], out_shape: Sequence[int]) -> Body:
    a, b = (graph.specs[v] for v in inputs)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = list(out_shape[:-2])
    sa = broadcast_strides(a.shape[:-2], batch)
    sb = broadcast_strides(b.shape[:-2], batch)
    lines = coords(out_shape)
    nb = len(batch)
    abase = " + ".join([f"c{i} * {s * m * k}" for i, s in enumerate(sa) if s]) or "0"
    bbase = " + ".join([f"c{i} * {s * k * n}" for i, s in enumerate(sb) if s]) or "0"
    t = WGSL_TYPE[a.dtype]
    lines += [f"let ab = {abase} + c{nb} * {k};", f"let bb = {bbase} + c{nb + 1};",
              f"var acc_r: {t} = {'0.0' if t == 'f32' else '0'};",
              f"for (var r: i32 = 0; r < {k}; r = r + 1) {{ acc_r = acc_r + in0[ab + r] * in1[bb + r * {n}]; }}",
              "let acc = acc_r;"]
    return Body(inputs, lines)


def _row(x_shape: Sequence[int], axis: int) -> tuple[list[str], int, int]:
    """Lines setting `base`, the flat index where the row through output index `idx` along `axis` starts,
    and the row's length and stride."""
    strides = row_major(x_shape)
    kept = [a for a in range(len(x_shape)) if a != axis]
    lines = coords(x_shape)
    base = " + ".join(f"c{a} * {strides[a]}" for a in kept) or "0"
    return [*lines, f"let base = {base};"], x_shape[axis], strides[axis]


def _softmax_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    """The composite whole, one thread per element: the row's max, then the sum of exp(x - max), in the
    decomposition's order (so the values are the unfused kernels')."""
    x = graph.specs[inputs[0]]
    axis = int(node.attrs.get("axis", -1)) % max(x.rank, 1)
    lines, n, step = _row(x.shape, axis)
    lines += ["var m = in0[base];",
              f"for (var r: i32 = 0; r < {n}; r = r + 1) {{ m = e_max(m, in0[base + r * {step}]); }}",
              "var total: f32 = 0.0;",
              f"for (var r: i32 = 0; r < {n}; r = r + 1) {{ total = total + exp(in0[base + r * {step}] - m); }}",
              "let acc = exp(in0[idx] - m) / total;"]
    return Body(inputs, lines)


def _rms_norm_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    """The composite whole over the last axis, one thread per element: x * rsqrt(mean(x*x) + eps) * weight,
    in the decomposition's order."""
    x = graph.specs[inputs[0]]
    lines, n, _ = _row(x.shape, x.rank - 1)
    eps = float(node.attrs.get("eps", 1e-6))
    weight = f" * in1[c{x.rank - 1}]" if len(inputs) > 1 else ""
    lines += ["var total: f32 = 0.0;",
              f"for (var r: i32 = 0; r < {n}; r = r + 1) {{ let v = in0[base + r]; total = total + v * v; }}",
              f"let inv = inverseSqrt(total / {float(n)!r} + f32({eps!r}));",
              f"let acc = (in0[idx] * inv){weight};"]
    return Body(inputs, lines)


def _layer_norm_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    """The composite whole over the last axis, one thread per element, in the decomposition's order: the row's
    mean, then the mean of (x - mean)^2, then (x - mean) * rsqrt(var + eps), times the weight, plus the bias
    (either may be absent)."""
    x = graph.specs[inputs[0]]
    lines, n, _ = _row(x.shape, x.rank - 1)
    eps = float(node.attrs.get("eps", 1e-5))
    last = f"c{x.rank - 1}"
    slots = {v: k for k, v in enumerate(inputs)}
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else ""
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    affine = (f" * in{slots[weight]}[{last}]" if weight else "") + (f" + in{slots[bias]}[{last}]" if bias else "")
    lines += ["var total: f32 = 0.0;",
              f"for (var r: i32 = 0; r < {n}; r = r + 1) {{ total = total + in0[base + r]; }}",
              f"let mean = total / {float(n)!r};",
              "var spread: f32 = 0.0;",
              f"for (var r: i32 = 0; r < {n}; r = r + 1) {{ let c = in0[base + r] - mean; spread = spread + c * c; }}",
              f"let inv = inverseSqrt(spread / {float(n)!r} + f32({eps!r}));",
              f"let acc = ((in0[idx] - mean) * inv){affine};"]
    return Body(inputs, lines)


def _matmul_int4_body(node: Node, graph: Graph, inputs: list[str], half: bool) -> Body:
    """a @ dequant(w).T, one thread per output: each weight is (q - zero point) * scale in f32, as the oracle
    dequantizes. Accumulated in f32, or (`half`, on adapters with shader-f16) in f16 within each group: the
    weight rounded to f16, multiplied by the activation rounded to f16 and summed in f16 over the group's
    g products, each group's sum then added in f32 (the f16 error stays bounded by one group's length).
    Packed bytes are read out of u32 words (WGSL has no u8)."""
    k, n, group = int(node.attrs["k"]), int(node.attrs["n"]), int(node.attrs["group_size"])
    blocks = -(-k // group)
    zp = len(inputs) > 3
    if zp and graph.specs[inputs[3]].dtype is DType.uint8:
        zero = f"f32({_byte('in3', f'c_n * {blocks} + b')})"
    elif zp:
        zero = f"in3[c_n * {blocks} + b]"
    else:
        zero = "8.0"
    # f32: one running sum, in the oracle's order; f16: a half sum per group, added in f32.
    into, start, end = ("part", ["  var part: f16 = f16(0.0);"], ["  acc_r = acc_r + f32(part);"]) if half \
        else ("acc_r", [], [])
    product = "f16(in0[ab + kk]) * f16((q - z) * s)" if half else "in0[ab + kk] * ((q - z) * s)"
    lines = [f"let c_n = i32(idx % {n}u);", f"let row = i32(idx / {n}u);",
             f"let ab = row * {k};", "var acc_r: f32 = 0.0;",
             f"for (var b: i32 = 0; b < {blocks}; b = b + 1) {{",
             f"  let s = in2[c_n * {blocks} + b];", f"  let z = {zero};",
             f"  let wb = (c_n * {blocks} + b) * {group // 2};", *start,
             f"  for (var j: i32 = 0; j < {group}; j = j + 1) {{",
             f"    let kk = b * {group} + j;",
             f"    if (kk >= {k}) {{ break; }}",
             f"    let byte = {_byte('in1', 'wb + j / 2')};",
             "    let q = f32((byte >> (u32(j & 1) * 4u)) & 15u);",
             f"    {into} = {into} + {product};",
             "  }", *end, "}", "let acc = acc_r;"]
    return Body(inputs, lines)


def _byte(array: str, index: str) -> str:
    """Byte `index` of a u32 array of packed bytes (little-endian words, as uploaded)."""
    return f"(({array}[u32({index}) / 4u] >> ((u32({index}) % 4u) * 8u)) & 255u)"


def _conv_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    x, w = graph.specs[inputs[0]], graph.specs[inputs[1]]
    out = graph.specs[node.outputs[0]]
    (sh, sw), (pt, pl, _, _), (dh, dw), groups = conv_geometry(node.attrs)
    _, c, h, wd = x.shape
    oc, cin_g, kh, kw = w.shape
    oc_g = oc // groups
    lines = coords(out.shape)  # c0 n, c1 oc, c2 oh, c3 ow
    lines += [f"let g = c1 / {oc_g};", f"var acc_r: f32 = {'in2[c1]' if len(inputs) > 2 else '0.0'};",
              f"for (var ic: i32 = 0; ic < {cin_g}; ic = ic + 1) {{",
              f"  let xc = c0 * {c * h * wd} + (g * {cin_g} + ic) * {h * wd};",
              f"  let wc = (c1 * {cin_g} + ic) * {kh * kw};",
              f"  for (var i: i32 = 0; i < {kh}; i = i + 1) {{",
              f"    let y = c2 * {sh} - {pt} + i * {dh};",
              f"    if (y < 0 || y >= {h}) {{ continue; }}",
              f"    for (var j: i32 = 0; j < {kw}; j = j + 1) {{",
              f"      let xx = c3 * {sw} - {pl} + j * {dw};",
              f"      if (xx < 0 || xx >= {wd}) {{ continue; }}",
              f"      acc_r = acc_r + in0[xc + y * {wd} + xx] * in1[wc + i * {kw} + j];",
              "    }", "  }", "}", "let acc = acc_r;"]
    return Body(inputs, lines)


def _pool_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    x = graph.specs[inputs[0]]
    out = graph.specs[node.outputs[0]]
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw), _ = pool_geometry(node.attrs)
    _, c, h, wd = x.shape
    is_max = node.op == "max_pool2d"
    lines = coords(out.shape)
    lines += [f"let xc = (c0 * {c} + c1) * {h * wd};",
              "var acc_r: f32 = " + ("e_bits(0xff800000u);" if is_max else "0.0;"),
              f"for (var i: i32 = 0; i < {kh}; i = i + 1) {{",
              f"  let y = c2 * {sh} - {pt} + i * {dh};",
              f"  if (y < 0 || y >= {h}) {{ continue; }}",
              f"  for (var j: i32 = 0; j < {kw}; j = j + 1) {{",
              f"    let xx = c3 * {sw} - {pl} + j * {dw};",
              f"    if (xx < 0 || xx >= {wd}) {{ continue; }}",
              f"    let v = in0[xc + y * {wd} + xx];",
              "    acc_r = " + ("e_max(acc_r, v);" if is_max else "acc_r + v;"),
              "  }", "}"]
    if is_max:
        lines.append("let acc = acc_r;")
    else:
        # The reference's divisor: window cells inside the input, plus the padding with count_include_pad
        # (never the ceil_mode overhang past the padding).
        inc = node.attrs.get("count_include_pad", True)
        lo_r, lo_c = (-pt, -pl) if inc else (0, 0)
        hi_r, hi_c = (h + pb, wd + pr) if inc else (h, wd)
        lines += [f"let r0 = c2 * {sh} - {pt};", f"let q0 = c3 * {sw} - {pl};",
                  f"let nr = min(r0 + {kh}, {hi_r}) - max(r0, {lo_r});",
                  f"let nc = min(q0 + {kw}, {hi_c}) - max(q0, {lo_c});",
                  "let acc = acc_r / f32(nr * nc);"]
    return Body(inputs, lines)


def _gather_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    data, idx = graph.specs[inputs[0]], graph.specs[inputs[1]]
    out = graph.specs[node.outputs[0]]
    axis = int(node.attrs.get("axis", 0)) % max(data.rank, 1)
    n = data.shape[axis]
    ds = row_major(data.shape)
    ist = row_major(idx.shape)
    lines = coords(out.shape)
    ir = idx.rank
    ioff = " + ".join(f"c{axis + i} * {ist[i]}" for i in range(ir)) or "0"
    pre = [f"c{a} * {ds[a]}" for a in range(axis)]
    post = [f"c{axis + ir + a - axis - 1} * {ds[a]}" for a in range(axis + 1, data.rank)]
    lines += [f"var ix = in1[{ioff}];",
              f"if (ix < -{n} || ix >= {n}) {{ status[0] = 1u; ix = 0; }}",
              f"if (ix < 0) {{ ix = ix + {n}; }}",
              f"let acc = in0[{' + '.join([*pre, f'ix * {ds[axis]}', *post])}];"]
    return Body(inputs, lines)


def _scatter_add_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    """Gather's transpose without atomics (WGSL has no float atomic add): each output element is its data
    element plus, in index order, every update whose index names its row, as the reference adds them."""
    data, idx = graph.specs[inputs[0]], graph.specs[inputs[1]]
    axis = int(node.attrs.get("axis", 0)) % data.rank
    rows, n = data.shape[axis], idx.numel
    post = math.prod(data.shape[axis + 1:])
    inner = row_major(data.shape[:axis])
    pre_flat = " + ".join(f"c{a} * {inner[a]}" for a in range(axis)) or "0"
    post_flat = " + ".join(f"c{a} * {s}" for a, s in zip(range(axis + 1, data.rank), row_major(data.shape[axis + 1:])))
    lines = [*coords(data.shape), "var acc = in0[idx];",
             f"let base = ({pre_flat}) * {n * post}{' + ' + post_flat if post_flat else ''};",
             f"for (var j = 0; j < {n}; j = j + 1) {{",
             "  var ix = in1[j];",
             f"  if (ix < -{rows} || ix >= {rows}) {{ status[0] = {STATUS_SCATTER_RANGE}u; ix = 0; }}",
             f"  if (ix < 0) {{ ix = ix + {rows}; }}",
             f"  if (ix == c{axis}) {{ acc = acc + in2[base + j * {post}]; }}",
             "}"]
    return Body(inputs, lines)


def _update_slice_body(node: Node, graph: Graph, inputs: list[str]) -> Body:
    """Out of place: each output element is the update's where its row is in [start, start + rows) (start
    clamped so the rows fit, as the reference does), else x's. The fusion pass writes only the rows, in
    place, where it can (update.py)."""
    x, update = graph.specs[inputs[0]], graph.specs[inputs[1]]
    axis = int(node.attrs.get("axis", 0)) % x.rank
    rows = update.shape[axis]
    ustrides = row_major(update.shape)
    at = " + ".join([f"c{a} * {s}" for a, s in enumerate(ustrides) if a != axis] + [f"r * {ustrides[axis]}"])
    lines = [*coords(x.shape), f"let first = clamp(i32(in2[0]), 0, {x.shape[axis] - rows});",
             f"let r = c{axis} - first;", "var acc = in0[idx];",
             f"if (r >= 0 && r < {rows}) {{ acc = in1[{at}]; }}"]
    return Body(inputs, lines)


def shader_source(in_types: Sequence[str], lines: Sequence[str], out_types: Sequence[str], threads: int, *,
            status: bool, params: bool = False, helpers: str = "") -> str:
    """A compute shader: bindings in0.. (read), out0.. (written), then status or params; the body runs for
    idx < threads and stores its outputs itself."""
    decls = [f"@group(0) @binding({k}) var<storage, read_write> in{k}: array<{t}>;" for k, t in enumerate(in_types)]
    decls += [f"@group(0) @binding({len(in_types) + j}) var<storage, read_write> out{j}: array<{t}>;"
              for j, t in enumerate(out_types)]
    nb = len(decls) - 1
    if status:
        decls.append(f"@group(0) @binding({nb + 1}) var<storage, read_write> status: array<u32>;")
    if params:
        decls.append(f"@group(0) @binding({nb + 1}) var<storage, read_write> params: array<i32>;")
    lines = [_widen_half(line, in_types, out_types) for line in lines]
    body = "\n  ".join(lines)
    uses_half = "f16" in (*in_types, *out_types) or any("f16" in line for line in lines)
    enable = "enable f16;\n" if uses_half else ""
    return (f"{enable}{PRELUDE}{PYMOD}{helpers}\n" + "\n".join(decls) +
            f"\n@compute @workgroup_size({WORKGROUP})\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
            f"  let idx = gid.x + gid.y * nwg.x * {WORKGROUP}u;\n"
            f"  if (idx >= {threads}u) {{ return; }}\n  {body}\n}}\n")


_LOAD = re.compile(r"\bin(\d+)\[([^\[\]]*)\]")
_STORE = re.compile(r"^(out(\d+)\[[^\[\]]*\] = )(.*);$")


def _widen_half(line: str, in_types: Sequence[str], out_types: Sequence[str]) -> str:
    """f16 buffers: every load widens to f32 and every store rounds to f16 (kernels compute in f32)."""
    if "f16" in in_types:
        line = _LOAD.sub(lambda m: f"f32({m.group(0)})" if in_types[int(m.group(1))] == "f16" else m.group(0), line)
    store = _STORE.match(line)
    if store and out_types[int(store.group(2))] == "f16":
        line = f"{store.group(1)}f16({store.group(3)});"
    return line
