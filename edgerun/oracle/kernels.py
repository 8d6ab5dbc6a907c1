"""Numpy kernels for every atomic op and raster. Each writes its result into preallocated output arrays.

Signature: kernel(inputs, attrs, outputs) -> None. Outputs are views into the runtime's arena, so a kernel
never rebinds them, it assigns into them (`out[...] = ...` or numpy's `out=`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgerun.errors import EdgerunError
from edgerun.ir.dtypes import NARROW_NAMES, DType, narrow_cast
from edgerun.ir.ops.atomic import conv_geometry, pool_geometry
from edgerun.ir.region import Region
from edgerun.oracle.quant_add_kernel import QUANT_ADD_KERNELS
from edgerun.oracle.quant_kernels import QUANT_KERNELS
from edgerun.oracle.string_kernels import STRING_KERNELS

Kernel = Callable[[list[np.ndarray], dict[str, Any], list[np.ndarray]], None]
KERNELS: dict[str, Kernel] = {}


def _kernel(*names: str) -> Callable[[Kernel], Kernel]:
    def deco(fn: Kernel) -> Kernel:
        for n in names:
            KERNELS[n] = fn
        return fn
    return deco


def _floating(x: np.ndarray) -> bool:
    """A float array, ml_dtypes' bfloat16, float8 and float4 included (numpy gives those kind 'V', not 'f')."""
    return x.dtype.kind == "f" or x.dtype.name.startswith(("bfloat", "float"))


# ---- elementwise -------------------------------------------------------------------------------------

_ERF_SERIES_TERMS = 36  # Maclaurin terms for |x| < 2.5: the last is below 1e-16 of the sum
_ERF_SMALL = 512  # below this many elements, per-element math.erf beats the passes' fixed cost
_ERFC_FRACTION_TERMS = 24  # continued-fraction depth for |x| >= 2.5: erfc is then < 4.1e-4, so 1e-12 suffices


def _erf(x: np.ndarray) -> np.ndarray:
    """erf in float64, rounded once to the input's dtype: matches correctly rounded float32 on a dense grid.

    numpy has no erf and scipy is not a runtime dependency. Abramowitz-Stegun 7.1.26 is only 1.5e-7 accurate
    (an ulp or more in float32), and math.erf element by element is 2.5x slower than these whole-array passes.
    """
    if x.size <= _ERF_SMALL or x.dtype == np.float64:  # the series below is float32-accurate only
        # ~70 whole-array passes cost ~80 us however small the array; per element math.erf is cheaper here.
        import math

        return np.asarray(np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)), dtype=x.dtype)
    xd = np.asarray(x, dtype=np.float64)
    ax = np.abs(xd)
    out = np.empty_like(xd)
    near = ax < 2.5
    s = xd[near]
    minus_s2 = -s * s
    term, total = s.copy(), s.copy()
    for n in range(1, _ERF_SERIES_TERMS):
        term *= minus_s2
        term *= 1.0 / n
        total += term * (1.0 / (2 * n + 1))
    out[near] = total * (2 / np.sqrt(np.pi))
    far = ~near
    if far.any():
        b = ax[far]
        frac = b.copy()
        for k in range(_ERFC_FRACTION_TERMS, 0, -1):  # erfc(b) = e^-b^2 / (sqrt(pi) (b + 1/2/(b + 1/(b + ...))))
            frac = b + (k / 2) / frac
        out[far] = np.copysign(1 - np.exp(-b * b) / (np.sqrt(np.pi) * frac), xd[far])
    return out.astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1 / (1 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1 + e)
    return out


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": _sigmoid, "erf": _erf, "sin": np.sin, "cos": np.cos,
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "neg": np.negative, "abs": np.abs,
    "sign": np.sign, "reciprocal": lambda x: np.reciprocal(x) if _floating(x) else (1 // x),
    "logical_not": np.logical_not,
}


def _unary_kernel(name: str) -> Kernel:
    fn = UNARY[name]

    def run(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
        with np.errstate(all="ignore"):
            outs[0][...] = fn(ins[0])
    return run


for _n in UNARY:
    KERNELS[_n] = _unary_kernel(_n)


def _div(a: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    rounding = attrs.get("rounding", "none")
    if _floating(a):
        q = np.true_divide(a, b)
        return np.floor(q) if rounding == "floor" else np.trunc(q) if rounding == "trunc" else q
    if np.any(b == 0):
        raise EdgerunError("integer division by zero")
    if rounding == "floor":
        return np.floor_divide(a, b)
    q = np.floor_divide(a, b)
    # Truncation toward zero: floor rounds down, so add one where the signs differ and it was inexact.
    return q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))


def _mod(a: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    if not _floating(a) and np.any(b == 0):
        raise EdgerunError("integer modulo by zero")
    return np.fmod(a, b) if attrs.get("fmod") else np.remainder(a, b)


def _pow(a: np.ndarray, b: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    if not _floating(a) and np.any(b < 0):
        raise EdgerunError("integer power with a negative exponent")
    return np.power(a, b)


BINARY: dict[str, Callable[[np.ndarray, np.ndarray, dict[str, Any]], np.ndarray]] = {
    "add": lambda a, b, _: np.add(a, b), "sub": lambda a, b, _: np.subtract(a, b),
    "mul": lambda a, b, _: np.multiply(a, b), "div": _div, "pow": _pow, "mod": _mod,
    "maximum": lambda a, b, _: np.maximum(a, b), "minimum": lambda a, b, _: np.minimum(a, b),
    "logical_and": lambda a, b, _: np.logical_and(a, b), "logical_or": lambda a, b, _: np.logical_or(a, b),
    "logical_xor": lambda a, b, _: np.logical_xor(a, b),
    "eq": lambda a, b, _: np.equal(a, b), "ne": lambda a, b, _: np.not_equal(a, b),
    "lt": lambda a, b, _: np.less(a, b), "le": lambda a, b, _: np.less_equal(a, b),
    "gt": lambda a, b, _: np.greater(a, b), "ge": lambda a, b, _: np.greater_equal(a, b),
}


def _binary_kernel(name: str) -> Kernel:
    fn = BINARY[name]

    def run(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
        with np.errstate(all="ignore"):
            outs[0][...] = fn(ins[0], ins[1], attrs)
    return run


for _n in BINARY:
    KERNELS[_n] = _binary_kernel(_n)


@_kernel("where")
def _where(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    outs[0][...] = np.where(ins[0], ins[1], ins[2])


@_kernel("bitcast")
def _bitcast(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    outs[0][...] = np.ascontiguousarray(ins[0]).view(DType(attrs["dtype"]).np)


def _string_cast(x: np.ndarray, to: DType) -> np.ndarray:
    """Cast to or from strings as ONNX's reference does it: numpy's str of each element (float32 0.1 is
    '0.1', True is 'True'), and numpy's parse of each string ('1.5', '-inf', '7'; narrow types through
    float32). A string that is not a number of the type is an EdgerunError naming it."""
    if to is DType.string:
        return np.asarray(x).astype(np.str_).astype(object)
    try:
        if to.is_narrow:
            return narrow_cast(x.astype(np.float32), to)
        return x.astype(to.np)
    except (ValueError, TypeError, OverflowError) as exc:
        raise EdgerunError(f"cast of a string tensor to {to.value}: {exc}") from None


@_kernel("cast")
def _cast(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x = ins[0]
    to = DType(attrs["dtype"])
    if to is DType.string or x.dtype == object:
        outs[0][...] = _string_cast(x, to)
        return
    if to.is_narrow or x.dtype.name in NARROW_NAMES:
        outs[0][...] = narrow_cast(x, to, bool(attrs.get("saturate", True)), str(attrs.get("round_mode", "up")))
        return
    target = to.np
    if x.dtype.kind == "f" and target.kind in "iu":
        outs[0][...] = float_to_int(x, target)
        return
    with np.errstate(all="ignore"):
        outs[0][...] = x.astype(target)


def float_to_int(x: np.ndarray, target: np.dtype) -> np.ndarray:
    """float -> int truncates toward zero; NaN and out-of-range values are undefined in C and in every
    framework, so pin them: NaN -> 0, and saturate, which is what most accelerators do. The bounds are
    compared in float64 (exact for float16/32 inputs): clipping in float32 would round int32's max up to
    2^31, which astype then wraps to INT_MIN."""
    info = np.iinfo(target)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        high, low = t >= info.max, t <= info.min
        y = np.where(high | low | np.isnan(t), 0.0, t).astype(target)
    y[high], y[low] = info.max, info.min
    return y


# ---- reductions --------------------------------------------------------------------------------------

def _axes(x: np.ndarray, attrs: dict[str, Any]) -> tuple[int, ...]:
    axes = attrs.get("axes")
    return tuple(range(x.ndim)) if axes is None else tuple(int(a) % max(x.ndim, 1) for a in axes)


def _reduce_kernel(fn: Callable[..., np.ndarray]) -> Kernel:
    def run(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
        x = ins[0]
        kw: dict[str, Any] = {}
        if fn in (np.sum, np.mean) and x.dtype == np.float16:
            kw["dtype"] = np.float32  # accumulate half precision in single, as every serious backend does
        elif fn is np.sum and x.dtype.kind in "iub":
            kw["dtype"] = outs[0].dtype
        r = fn(x, axis=_axes(x, attrs), keepdims=bool(attrs.get("keepdims", False)), **kw)
        outs[0][...] = r
    return run


KERNELS["reduce_sum"] = _reduce_kernel(np.sum)
KERNELS["reduce_mean"] = _reduce_kernel(np.mean)
KERNELS["reduce_max"] = _reduce_kernel(np.max)
KERNELS["reduce_min"] = _reduce_kernel(np.min)


def _arg_kernel(fn: Callable[..., np.ndarray]) -> Kernel:
    def run(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
        x = ins[0]
        axis = int(attrs.get("axis", 0)) % max(x.ndim, 1)
        keep = bool(attrs.get("keepdims", False))
        if attrs.get("select_last_index"):
            flipped = np.flip(x, axis=axis)
            r = x.shape[axis] - 1 - fn(flipped, axis=axis, keepdims=keep)
        else:
            r = fn(x, axis=axis, keepdims=keep)
        outs[0][...] = r
    return run


KERNELS["argmax"] = _arg_kernel(np.argmax)
KERNELS["argmin"] = _arg_kernel(np.argmin)

# ---- linear algebra and windows ----------------------------------------------------------------------


@_kernel("matmul")
def _matmul(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    np.matmul(ins[0], ins[1], out=outs[0])


def _windows(x: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int],
             out_hw: tuple[int, int]) -> np.ndarray:
    """A zero-copy [N, C, OH, OW, KH, KW] view of every window of a padded NCHW tensor."""
    n, c, _, _ = x.shape
    sn, sc, sh, sw = x.strides
    return as_strided(x, (n, c, out_hw[0], out_hw[1], kernel[0], kernel[1]),
                      (sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1]),
                      writeable=False)


def _pad_hw(x: np.ndarray, pads: tuple[int, int, int, int], value: float, extra: tuple[int, int] = (0, 0)) -> np.ndarray:
    top, left, bottom, right = pads
    if not any(pads) and not any(extra):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom + extra[0]), (left, right + extra[1])), constant_values=value)


@_kernel("conv2d")
def _conv2d(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    stride, pads, dil, groups = conv_geometry(attrs)
    out = outs[0]
    n, oc, oh, ow = out.shape
    kh, kw = w.shape[2], w.shape[3]
    xp = _pad_hw(x, pads, 0.0)
    cin_g, oc_g = w.shape[1], oc // groups
    if groups == 1 and kh == kw == 1 and stride == (1, 1):
        # Pointwise convolution is a plain GEMM over channels: no im2col needed.
        res = np.matmul(w.reshape(oc, cin_g), xp.reshape(n, cin_g, oh * ow))
        out[...] = res.reshape(n, oc, oh, ow)
    elif groups == x.shape[1] and cin_g == 1 and oc_g == 1:
        # Depthwise: accumulate the kh*kw shifted windows, channel by channel in one broadcast multiply.
        win = _windows(xp, (kh, kw), stride, dil, (oh, ow))
        acc = np.zeros((n, oc, oh, ow), dtype=np.float32 if x.dtype == np.float16 else x.dtype)
        for i in range(kh):
            for j in range(kw):
                acc += win[:, :, :, :, i, j] * w[None, :, 0, i, j, None, None]
        out[...] = acc
    else:
        win = _windows(xp, (kh, kw), stride, dil, (oh, ow))  # N, C, OH, OW, KH, KW
        for g in range(groups):
            cols = win[:, g * cin_g:(g + 1) * cin_g].transpose(0, 2, 3, 1, 4, 5).reshape(n, oh * ow, -1)
            wg = w[g * oc_g:(g + 1) * oc_g].reshape(oc_g, -1)
            res = np.matmul(cols, wg.T)  # N, OH*OW, OCg
            out[:, g * oc_g:(g + 1) * oc_g] = res.transpose(0, 2, 1).reshape(n, oc_g, oh, ow)
    if bias is not None:
        out += bias.reshape(1, oc, 1, 1)


def _pool_input(x: np.ndarray, attrs: dict[str, Any], out_hw: tuple[int, int], value: float) -> tuple[np.ndarray, Any]:
    kernel, stride, pads, dil, _ = pool_geometry(attrs)
    # ceil_mode windows may run past the end padding: pad enough extra that every window is in bounds.
    need_h = (out_hw[0] - 1) * stride[0] + dil[0] * (kernel[0] - 1) + 1
    need_w = (out_hw[1] - 1) * stride[1] + dil[1] * (kernel[1] - 1) + 1
    h, w = x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]
    xp = _pad_hw(x, pads, value, (max(0, need_h - h), max(0, need_w - w)))
    return _windows(xp, kernel, stride, dil, out_hw), (kernel, stride, pads, dil)


@_kernel("max_pool2d")
def _max_pool(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x = ins[0]
    fill = -np.inf if _floating(x) else np.iinfo(x.dtype).min
    win, _ = _pool_input(x, attrs, outs[0].shape[2:], fill)
    outs[0][...] = win.max(axis=(4, 5))


@_kernel("avg_pool2d")
def _avg_pool(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x = ins[0]
    oh, ow = outs[0].shape[2:]
    win, (kernel, stride, pads, _) = _pool_input(x, attrs, (oh, ow), 0.0)
    total = win.sum(axis=(4, 5), dtype=np.float32 if x.dtype == np.float16 else x.dtype)
    h, w = x.shape[2], x.shape[3]
    # Divisor per output position: window cells inside the input, plus the padding when
    # count_include_pad (but never the ceil_mode overhang past the padding, as in PyTorch).
    rows = np.arange(oh) * stride[0] - pads[0]
    cols = np.arange(ow) * stride[1] - pads[1]
    include_pad = attrs.get("count_include_pad", True)
    lo_r, lo_c = (-pads[0], -pads[1]) if include_pad else (0, 0)
    hi_r, hi_c = (h + pads[2], w + pads[3]) if include_pad else (h, w)
    cnt_r = np.minimum(rows + kernel[0], hi_r) - np.maximum(rows, lo_r)
    cnt_c = np.minimum(cols + kernel[1], hi_c) - np.maximum(cols, lo_c)
    outs[0][...] = total / (cnt_r[:, None] * cnt_c[None, :]).astype(total.dtype)


@_kernel("gather")
def _gather(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    data, idx = ins
    axis = int(attrs.get("axis", 0)) % max(data.ndim, 1)
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise EdgerunError(f"gather index out of range [{-n}, {n}) on axis {axis}")
    outs[0][...] = np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)


@_kernel("scatter_add")
def _scatter_add(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    """updates[..., i, ...] added to out[..., indices[i], ...], each index in turn (numpy's unbuffered add.at:
    a repeated index accumulates, in index order, as torch's index_add and ONNX's reference do)."""
    data, idx, updates = ins
    out = outs[0]
    axis = int(attrs.get("axis", 0)) % data.ndim
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise EdgerunError(f"scatter_add index out of range [{-n}, {n}) on axis {axis}")
    if not np.may_share_memory(out, data):
        np.copyto(out, data)
    pre, post = int(np.prod(data.shape[:axis])), int(np.prod(data.shape[axis + 1:]))
    flat = np.where(idx < 0, idx + n, idx).reshape(-1)
    np.add.at(out.reshape(pre, n, post), (slice(None), flat), updates.reshape(pre, flat.size, post))  # type: ignore[arg-type]


# ---- raster ------------------------------------------------------------------------------------------


def raster_views(ins: list[np.ndarray], regions: Any, out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) 3-D views for each non-empty region (Region.views): the raster is copying each pair."""
    flat_out = out.reshape(-1)
    flats = [np.ascontiguousarray(x).reshape(-1) for x in ins]
    return [r.views(flats[r.src], flat_out) for r in map(Region.of, regions) if r.numel]


@_kernel("raster")
def _raster(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    fill = attrs.get("fill")
    if fill is not None:
        outs[0].reshape(-1)[...] = fill
    for dst, src in raster_views(ins, attrs["regions"], outs[0]):
        np.copyto(dst, src)


# ---- quantized ops (exact integer kernels, edgerun/oracle/quant_kernels.py) ---------------------------
KERNELS.update(QUANT_KERNELS)
KERNELS.update(QUANT_ADD_KERNELS)
KERNELS.update(STRING_KERNELS)  # string ops (oracle/string_kernels.py): the reference alone runs them


@_kernel("update_slice")
def _update_slice(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    """Rows of `update` into a copy of `x` from row `start` (clamped to fit); when the output is `x`'s own
    buffer (a state updated in place) only those rows are written."""
    x, update, start = ins
    out = outs[0]
    axis = int(attrs.get("axis", 0)) % x.ndim
    if not np.may_share_memory(out, x):  # a planned output never partly overlaps an input: it is x or apart
        np.copyto(out, x)
    rows = update.shape[axis]
    first = min(max(int(start.reshape(-1)[0]), 0), x.shape[axis] - rows)
    index = [slice(None)] * x.ndim
    index[axis] = slice(first, first + rows)
    out[tuple(index)] = update
