"""int8/uint8 storage and the quantized ops' kernels (quantize, dequantize, dynamic quantize, requantize,
integer matmul and conv, and gather of 8-bit data), bit for bit the oracle's (edgerun/oracle/quant_kernels.py).

WGSL has no 8-bit types, so an int8 or uint8 value is an array<u32> of little-endian bytes, 4 elements a word
(the host packs and unpacks them as raw bytes: runner.to_device). A kernel reads element i with
`extractBits` of word i / 4 (the i32 form sign-extends int8, the u32 form zero-extends uint8). A kernel that
writes 8-bit values runs one thread per output word, computing its 4 elements and storing the whole word: no
two threads touch one word, and the tail word's spare bytes lie in the value's own range (ranges are rounded
up to 4 bytes and aligned to the adapter's storage offset alignment), so nothing needs a read-modify-write.

Each kernel is a dispatch of its own (no fusion): the ops are few per layer and their neighbours' fused
chains compute in f32/i32, which cannot hold packed bytes.

Exactness: integer products accumulate in i32, which wraps as the oracle's int32 cast does. Rounding is
WGSL `round` (half to even). requantize's exact form multiplies the accumulator by the scale's 24-bit
mantissa (`frexp`) in 64 bits built from 16-bit limbs and rounds the shift half to even, as the oracle's
int64 fixed point. Float steps are single IEEE operations in the oracle's order; WGSL lets `x / y` be off
by 2.5 ulp, so quantize_linear's and dynamic_quantize's divisions are exact only on adapters whose division
is correctly rounded (lavapipe's is, which the tests check against the oracle).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgerun.backends.webgpu.wgsl import Kernel, broadcast_strides, coords, row_major, shader_source
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry

INT8_OPS = frozenset({"quantize_linear", "dequantize_linear", "dynamic_quantize", "requantize",
                      "matmul_integer", "conv_integer"})
BYTES = frozenset({DType.int8, DType.uint8})
STATUS_DYNAMIC_NONFINITE = 2  # the status word's value when dynamic_quantize meets NaN or infinity

# (bound inputs, outputs, lines, threads, status) -> the node's Kernel
MakeKernel = Callable[[list[str], list[str], list[str], int, bool], Kernel]
_RANGE = {DType.int8: (-128, 127), DType.uint8: (0, 255)}

# 64-bit products from 16-bit limbs and requantize's exact rounding (see the module doc).
_EXACT = """
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2<u32>((p00 & 0xffffu) | (mid << 16u), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
// round_half_even(acc * scale), clamped to +-2^24 (beyond any 8-bit result plus zero point: it saturates)
fn rq_exact(acc: i32, scale: f32) -> i32 {
  let fe = frexp(scale);
  let m = i32(fe.fract * 16777216.0);
  let s = 24 - fe.exp;
  if (acc == 0 || m == 0) { return 0; }
  let neg = (acc < 0) != (m < 0);
  let big = select(16777216, -16777216, neg);
  if (s <= 0) { return big; }
  let ua = select(bitcast<u32>(acc), 0u - bitcast<u32>(acc), acc < 0);
  let p = mul_wide(ua, u32(abs(m)));
  let sh = u32(min(s, 63));
  var q: vec2<u32>;
  if (sh < 32u) {
    q = vec2<u32>((p.x >> sh) | (p.y << (32u - sh)), p.y >> sh);
  } else {
    q = vec2<u32>(p.y >> (sh - 32u), 0u);
  }
  let b = sh - 1u;
  var half: u32;
  var sticky: bool;
  if (b < 32u) {
    half = (p.x >> b) & 1u;
    sticky = b > 0u && (p.x & ((1u << b) - 1u)) != 0u;
  } else {
    half = (p.y >> (b - 32u)) & 1u;
    sticky = p.x != 0u || (p.y & ((1u << (b - 32u)) - 1u)) != 0u;
  }
  if (q.y != 0u || q.x >= 16777216u) { return big; }
  var r = i32(q.x);
  if (half == 1u && (sticky || (q.x & 1u) == 1u)) { r = r + 1; }
  return select(r, -r, neg);
}
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
"""


def storage(dtype: DType) -> str:
    return "u32" if dtype in BYTES else "f32" if dtype is DType.float32 else "i32"


def _loader(k: int, dtype: DType) -> str:
    """fn ld{k}(i) -> i32: element i of binding k (8-bit values unpacked, int32 as is)."""
    if dtype is DType.int8:
        body = f"extractBits(bitcast<i32>(in{k}[u32(i) >> 2u]), (u32(i) & 3u) * 8u, 8u)"
    elif dtype is DType.uint8:
        body = f"i32(extractBits(in{k}[u32(i) >> 2u], (u32(i) & 3u) * 8u, 8u))"
    else:
        body = f"in{k}[i]"
    return f"fn ld{k}(i: i32) -> i32 {{ return {body}; }}\n"


def _offset(strides: list[int], prefix: str = "c") -> str:
    return " + ".join(f"{prefix}{a} * {s}" for a, s in enumerate(strides) if s) or "0"


def _packed(numel: int, element: list[str]) -> list[str]:
    """Lines of a thread owning output word idx: `element` computes `v` (i32) for flat index `e`."""
    return ["var word: u32 = 0u;",
            "for (var j: u32 = 0u; j < 4u; j = j + 1u) {",
            "  let e = idx * 4u + j;",
            f"  if (e >= {numel}u) {{ break; }}",
            *("  " + line for line in element),
            "  word = word | ((bitcast<u32>(v) & 255u) << (j * 8u));",
            "}",
            "out0[idx] = word;"]


def _quantize_element(x_shape: tuple[int, ...], scale_shape: tuple[int, ...], zp_shape: tuple[int, ...],
                      dtype: DType) -> list[str]:
    """v = saturate(round_half_even(x / scale) + zp) at flat index e; x in0, scale in1, zp ld2."""
    lo, hi = _RANGE[dtype]
    return [*coords(x_shape, var="e"),
            f"let sv = in1[{_offset(broadcast_strides(scale_shape, x_shape))}];",
            f"let zv = ld2({_offset(broadcast_strides(zp_shape, x_shape))});",
            "var r = round(in0[e] / sv);",
            "if (is_nan(r)) { r = 0.0; }",
            f"let v = i32(clamp(r + f32(zv), {lo}.0, {hi}.0));"]


def _source(graph: Graph, bound: list[str], outs: list[str], lines: list[str], threads: int,
            status: bool = False) -> str:
    helpers = _EXACT + "".join(_loader(k, graph.specs[v].dtype) for k, v in enumerate(bound)
                               if graph.specs[v].dtype is not DType.float32)
    return shader_source([storage(graph.specs[v].dtype) for v in bound], lines,
                         [storage(graph.specs[v].dtype) for v in outs], threads, status=status, helpers=helpers)


def _words(numel: int) -> int:
    return max(-(-numel // 4), 1)


def int8_kernels(node: Node, graph: Graph) -> list[Kernel]:
    """The dispatches of one quantized op (two for dynamic_quantize: its parameters, then the codes)."""
    spec = graph.specs
    ins = [v for v in node.inputs if v]
    out = node.outputs[0]
    label = f"{node.op}:int8"

    def kernel(bound: list[str], outs: list[str], lines: list[str], threads: int, status: bool = False) -> Kernel:
        return Kernel(_source(graph, bound, outs, lines, threads, status), [*bound, *outs], threads, [node.name],
                      label=label, n_outputs=len(outs), status=status)

    if node.op == "quantize_linear":
        x, s, z = ins
        numel = spec[x].numel
        lines = _packed(numel, _quantize_element(spec[x].shape, spec[s].shape, spec[z].shape, spec[out].dtype))
        return [kernel(ins, [out], lines, _words(numel))]
    if node.op == "dequantize_linear":
        q, s, z = ins
        shape = spec[q].shape
        lines = [*coords(shape),
                 f"let d = ld0(i32(idx)) - ld2({_offset(broadcast_strides(spec[z].shape, shape))});",
                 f"out0[idx] = f32(d) * in1[{_offset(broadcast_strides(spec[s].shape, shape))}];"]
        return [kernel(ins, [out], lines, spec[q].numel)]
    if node.op == "requantize":
        acc, s, z = ins
        shape = spec[acc].shape
        lo, hi = _RANGE[spec[out].dtype]
        head = [*coords(shape, var="e"),
                "let a = in0[e];",
                f"let sv = in1[{_offset(broadcast_strides(spec[s].shape, shape))}];",
                f"let zv = ld2({_offset(broadcast_strides(spec[z].shape, shape))});"]
        if node.attrs.get("arithmetic", "exact") == "float32":
            # MLAS: round(f32(acc) * scale), saturated before the zero point is added
            body = [f"let v = i32(clamp(round(f32(a) * sv), f32({lo} - zv), f32({hi} - zv))) + zv;"]
        else:
            body = [f"let v = clamp(rq_exact(a, sv) + zv, {lo}, {hi});"]
        return [kernel(ins, [out], _packed(spec[acc].numel, head + body), _words(spec[acc].numel))]
    if node.op == "dynamic_quantize":
        return _dynamic_quantize(node, graph, kernel)
    if node.op == "gather":
        return [kernel(ins, [out], _packed(spec[out].numel, _gather_element(node, graph)), _words(spec[out].numel),
                       status=True)]
    if node.op == "matmul_integer":
        return [kernel(ins, [out], _matmul_integer_lines(node, graph), spec[out].numel)]
    if node.op == "conv_integer":
        return [kernel(ins, [out], _conv_integer_lines(node, graph), spec[out].numel)]
    raise ValueError(f"{node.op} is not an int8 op")


def is_int8_node(node: Node, graph: Graph) -> bool:
    """A node int8.py computes: a quantized op, or a gather of 8-bit data (a quantized embedding table)."""
    return node.op in INT8_OPS or (node.op == "gather" and graph.specs[node.inputs[0]].dtype in BYTES)


def _gather_element(node: Node, graph: Graph) -> list[str]:
    """v = data[..., indices[...], ...] at flat output index e; an index out of range sets the status word
    (as wgsl's float gather: the reference raises)."""
    data, idx = graph.specs[node.inputs[0]], graph.specs[node.inputs[1]]
    axis = int(node.attrs.get("axis", 0)) % max(data.rank, 1)
    n = data.shape[axis]
    ds, ist = row_major(data.shape), row_major(idx.shape)
    ioff = " + ".join(f"c{axis + i} * {ist[i]}" for i in range(idx.rank)) or "0"
    pre = [f"c{a} * {ds[a]}" for a in range(axis)]
    post = [f"c{idx.rank + a - 1} * {ds[a]}" for a in range(axis + 1, data.rank)]
    return [*coords(graph.specs[node.outputs[0]].shape, var="e"),
            f"var ix = in1[{ioff}];",
            f"if (ix < -{n} || ix >= {n}) {{ status[0] = 1u; ix = 0; }}",
            f"if (ix < 0) {{ ix = ix + {n}; }}",
            f"let v = ld0({' + '.join([*pre, f'ix * {ds[axis]}', *post])});"]


def _dynamic_quantize(node: Node, graph: Graph, kernel: MakeKernel) -> list[Kernel]:
    """Two dispatches: one thread per 4 rows finds each row's range (including 0) and writes its scale and
    zero point (ONNX DynamicQuantizeLinear's formulas in float32); then quantize_linear's kernel with them."""
    spec = graph.specs
    x = node.inputs[0]
    q, scale, zp = node.outputs
    dtype = spec[q].dtype
    lo, hi = _RANGE[dtype]
    shape = spec[x].shape
    length = shape[-1] if node.attrs.get("per_token") else spec[x].numel
    rows = spec[x].numel // max(length, 1)
    params = [
        "var word: u32 = 0u;",
        "for (var j: u32 = 0u; j < 4u; j = j + 1u) {",
        "  let row = idx * 4u + j;",
        f"  if (row >= {rows}u) {{ break; }}",
        "  var mn: f32 = 0.0;",
        "  var mx: f32 = 0.0;",
        f"  for (var i: u32 = row * {length}u; i < (row + 1u) * {length}u; i = i + 1u) {{",
        "    let xv = in0[i];",
        f"    if (!is_finite(xv)) {{ status[0] = {STATUS_DYNAMIC_NONFINITE}u; }}",
        "    mn = min(mn, xv);",
        "    mx = max(mx, xv);",
        "  }",
        "  let span = mx - mn;",
        f"  let sv = select(span / {float(hi - lo)}, 1.0, span == 0.0);",
        f"  let v = i32(round(clamp({float(lo)} - mn / sv, {float(lo)}, {float(hi)})));",
        "  out0[row] = sv;",
        "  word = word | ((bitcast<u32>(v) & 255u) << (j * 8u));",
        "}",
        "out1[idx] = word;"]
    first = kernel([x], [scale, zp], params, _words(rows), True)
    codes = _packed(spec[x].numel, _quantize_element(shape, spec[scale].shape, spec[zp].shape, dtype))
    return [first, kernel([x, scale, zp], [q], codes, _words(spec[x].numel), False)]


def _zero_strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major strides with 0 on size-1 axes (a broadcast operand read at the output's coordinates)."""
    return [s if d != 1 else 0 for s, d in zip(row_major(shape), shape)]


def _matmul_integer_lines(node: Node, graph: Graph) -> list[str]:
    spec = graph.specs
    a, b, az, bz = node.inputs
    out = spec[node.outputs[0]].shape
    rank = len(out)
    k = spec[a].shape[-1]

    def operand(v: str, zp: str, row: str, col: str) -> tuple[str, str]:
        """(offset of v at (batch, row, col), its zero point's offset) as WGSL, col the loop variable."""
        shape = spec[v].shape
        lead = rank - len(shape)
        axes = [f"c{lead + i}" for i in range(len(shape) - 2)] + [row, col]
        st = _zero_strides(shape)
        zst = broadcast_strides(spec[zp].shape, shape)
        off = " + ".join(f"{ax} * {s}" for ax, s in zip(axes, st) if s) or "0"
        zoff = " + ".join(f"{ax} * {s}" for ax, s in zip(axes, zst) if s) or "0"
        return off, zoff

    a_off, az_off = operand(a, az, f"c{rank - 2}", "k")
    b_off, bz_off = operand(b, bz, "k", f"c{rank - 1}")
    return [*coords(out),
            "var acc: i32 = 0;",
            f"for (var k: i32 = 0; k < {k}; k = k + 1) {{",
            f"  acc = acc + (ld0({a_off}) - ld2({az_off})) * (ld1({b_off}) - ld3({bz_off}));",
            "}",
            "out0[idx] = acc;"]


def _conv_integer_lines(node: Node, graph: Graph) -> list[str]:
    spec = graph.specs
    x, w, _, wz = node.inputs
    (sh, sw), (pt, pl, _, _), (dh, dw), groups = conv_geometry(node.attrs)
    _, c, h, wd = spec[x].shape
    oc, cin_g, kh, kw = spec[w].shape
    oc_g = oc // groups
    w_zero = "ld3(c1)" if spec[wz].numel > 1 else "ld3(0)"
    # the padding is a real zero: out-of-range taps are skipped, never read as x_zp
    return [*coords(spec[node.outputs[0]].shape),  # c0 n, c1 oc, c2 oh, c3 ow
            f"let g = c1 / {oc_g};",
            "let xz = ld2(0);",
            f"let wz = {w_zero};",
            "var acc: i32 = 0;",
            f"for (var ic: i32 = 0; ic < {cin_g}; ic = ic + 1) {{",
            f"  let xc = c0 * {c * h * wd} + (g * {cin_g} + ic) * {h * wd};",
            f"  let wc = (c1 * {cin_g} + ic) * {kh * kw};",
            f"  for (var i: i32 = 0; i < {kh}; i = i + 1) {{",
            f"    let y = c2 * {sh} - {pt} + i * {dh};",
            f"    if (y < 0 || y >= {h}) {{ continue; }}",
            f"    for (var j: i32 = 0; j < {kw}; j = j + 1) {{",
            f"      let xx = c3 * {sw} - {pl} + j * {dw};",
            f"      if (xx < 0 || xx >= {wd}) {{ continue; }}",
            "      acc = acc + (ld0(xc + y * " + str(wd) + " + xx) - xz) * (ld1(wc + i * " + str(kw) + " + j) - wz);",
            "    }", "  }", "}",
            "out0[idx] = acc;"]


def dequantize_claimable(node: Node, graph: Graph) -> bool:
    """int32 data only with a constant zero point of zeros (q - zp in i32 could wrap otherwise; the oracle's
    difference is int64); 8-bit data always."""
    q, _, zp = node.inputs
    if graph.specs[q].dtype in BYTES:
        return True
    return zp in graph.constants and not np.any(graph.constants[zp])


def requantize_claimable(node: Node, graph: Graph) -> bool:
    """The exact form only with a constant, finite scale: the oracle raises on a non-finite one, which a
    shader cannot (the float32 form has no such check)."""
    if node.attrs.get("arithmetic", "exact") == "float32":
        return True
    scale = node.inputs[1]
    return scale in graph.constants and bool(np.all(np.isfinite(graph.constants[scale])))

