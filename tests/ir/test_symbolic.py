"""SymDim: canonical forms, int-like arithmetic, the text round trip, evaluation and the clear refusals."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from edgerun.errors import EdgerunError
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import (
    SymDim,
    evaluate,
    floordiv,
    free_symbols,
    mod,
    substitute,
    sym,
    sym_max,
    sym_min,
    value_range,
)
from edgerun.ir.symbolic_text import parse_dim
from edgerun.ir.tensor_spec import TensorSpec

seq, batch, h = sym("seq"), sym("batch"), sym("h")


def test_equal_expressions_compare_and_hash_equal() -> None:
    assert seq * batch == batch * seq and hash(seq * batch) == hash(batch * seq)
    assert (seq + 1) * (seq - 1) == seq * seq - 1
    assert 2 * seq - seq == seq
    assert (seq * 4 + 6) // 2 == 2 * seq + 3
    assert ((h - 1) // 2) // 2 // 2 == (h - 1) // 8  # stacked stride-2 convolutions, as torch writes them
    assert seq + 1 != seq and seq != batch
    assert {seq + 2: "a"}[2 + seq] == "a"


def test_arithmetic_that_comes_out_constant_is_a_plain_int() -> None:
    for value, want in [(seq - seq, 0), ((seq * 4 + 6) % 2, 0), ((2 * seq + 3) % 2, 1), (seq * 0, 0),
                        (sym_max(seq, seq + 3), None), (floordiv(12, 4), 3)]:
        if want is None:
            assert value == seq + 3
        else:
            assert type(value) is int and value == want


def test_numpy_integers_mix_with_symbols() -> None:
    assert np.int64(3) + seq == seq + 3
    assert seq * np.int32(2) == 2 * seq


@pytest.mark.parametrize("expr", [
    seq, seq + 1, 2 * seq - 7, (h - 3) // 2 + 1, 2 * ((h - 3) // 2) * batch + seq * seq - 4, -seq, 3 - seq,
    seq % 3, sym_max(seq, batch) * 3 - 1, sym_min(seq, batch + 2), (seq * batch) // (h + 1), seq // 2 // 3,
])
def test_text_round_trip(expr: SymDim) -> None:
    text = str(expr)
    back = parse_dim(text)
    assert back == expr and hash(back) == hash(expr) and str(back) == text


def test_text_reads_the_usual_way() -> None:
    assert str((h - 3) // 2 + 1) == "((h + 1)//2) - 1"  # the dividend's constant reduced into [0, 2)
    assert str(2 * seq + 1) == "2*seq + 1"
    assert parse_dim("  seq*2 +1 ") == 2 * seq + 1
    assert parse_dim("17") == 17


@pytest.mark.parametrize("text", ["seq +", "seq)", "2**seq", "__import__('os')", "max(seq)", "1e3", "seq; 1",
                                  "(" * 100 + "seq" + ")" * 100, "s" * 5000])
def test_parse_refuses_malformed_text_without_eval(text: str) -> None:
    with pytest.raises(EdgerunError):
        parse_dim(text)


def test_evaluate_and_substitute() -> None:
    expr = (h - 3) // 2 + 1
    assert evaluate(expr, {"h": 11}) == 5
    assert evaluate(sym_max(seq, batch) * 2, {"seq": 3, "batch": 5}) == 10
    assert evaluate(seq % 4, {"seq": 10}) == 2
    assert evaluate(7, {}) == 7
    assert substitute(seq * batch, {"seq": 2}) == 2 * batch
    assert free_symbols(seq * batch + h) == {"seq", "batch", "h"}
    with pytest.raises(EdgerunError, match="no value for symbol 'batch'"):
        evaluate(seq * batch, {"seq": 2})


def test_concrete_uses_name_the_symbol() -> None:
    with pytest.raises(EdgerunError, match="symbolic dimension 'seq' used where a concrete size is needed"):
        int(seq)
    with pytest.raises(EdgerunError, match="'seq'"):
        np.zeros((seq, 2))
    with pytest.raises(EdgerunError, match="truth value"):
        bool(seq - 1)
    with pytest.raises(EdgerunError, match="cannot decide"):
        _ = seq < batch
    assert seq + 1 > seq and seq <= seq


def test_symbols_are_validated() -> None:
    for bad in ["1x", "max", "a-b", ""]:
        with pytest.raises(EdgerunError, match="invalid symbol name"):
            sym(bad)


def test_copy_and_pickle_keep_identity_of_value() -> None:
    expr = (h - 3) // 2 + batch
    assert copy.deepcopy([expr])[0] == expr
    assert pickle.loads(pickle.dumps(expr)) == expr


def test_tensor_spec_holds_symbols_and_json_round_trips() -> None:
    spec = TensorSpec((batch, seq * 2, 8), DType.float32)
    assert not spec.is_static and TensorSpec((2, 3), DType.float32).is_static
    assert spec.numel == batch * seq * 16
    assert str(spec) == "float32[batch,2*seq,8]"
    as_json = spec.to_json()
    assert as_json == {"shape": [{"sym": "batch"}, {"sym": "2*seq"}, 8], "dtype": "float32"}
    assert TensorSpec.from_json(as_json) == spec
    assert TensorSpec((np.int64(2), 3), DType.int8).shape == (2, 3)


x = sym("x")


@pytest.mark.parametrize("a, b", [
    ((h - 3) // 2 + 1, (h - 1) // 2),  # two conv spellings of one output size
    ((h - 3) // 2, (h + 1) // 2 - 2),
    ((3 * h - 1) % 2, (h + 1) % 2),
    (floordiv(h, -2), floordiv(-h, 2)),  # one sign of divisor
    (floordiv(-h, 2), h // 2 - h),  # -h = 2*(-h) + h: the dividend's coefficient reduced into [0, 2)
    (mod(h, -3), -((-h) % 3)),
    (((x - 192) // 128 + 1) // 4, (x - 64) // 512),  # nested quotients merge (silero-vad's frame count)
    ((x % 12) % 4, x % 4),
    ((x % 3) // 4, 0),
    ((x % 3 + 1) % 4, x % 3 + 1),
    (x - 2 * (x // 2), x % 2),  # how ONNX exporters spell a remainder
    (-2 * ((-x) // 2) - x, x % 2),  # ... and 2*ceil(x/2) - x
    (x - sym_min(x + 1, 0), sym_max(x, -1)),  # a sum holding one min is the max of sums
    (sym_max(x, batch) + 1 - batch, sym_max(x - batch + 1, 1)),
    (sym_max(x % 2 + 1, 0), x % 2 + 1),  # remainders bound the difference without any bounds
    ((2 * sym_max(x, batch) + 1) - 1, 2 * sym_max(x, batch)),
    (-sym_max(x, batch), sym_min(-x, -batch)),
])
def test_spellings_of_one_size_have_one_canonical_form(a, b) -> None:
    assert a == b and hash(a) == hash(b)
    back = parse_dim(str(a))
    assert back == a and str(back) == str(a)


@pytest.mark.parametrize("build", [
    lambda x, h, b: (h - 3) // 2 + 1,
    lambda x, h, b: ((x - 192) // 128 + 1) // 4,
    lambda x, h, b: x - 2 * (x // 2),
    lambda x, h, b: x - sym_min(x + 1, 0),
    lambda x, h, b: (3 * h - 7) % 5,
    lambda x, h, b: (x % 12) % 4 + (x % 3) // 4,
    lambda x, h, b: sym_max(x, b) * 2 - b,
    lambda x, h, b: (x * b + 5) // 3,
    lambda x, h, b: floordiv(x - 7, -4),
    lambda x, h, b: mod(2 * x + 1, -3),
    lambda x, h, b: -2 * ((-x) // 2) - x + h // 2 * 4,
])
def test_canonical_forms_keep_the_value(build) -> None:
    """Every rewrite is an identity over all integers: the canonical form (and its text read back) evaluates
    to what Python's own // % max min give on the same construction with ints."""
    expr = build(x, h, batch)
    back = parse_dim(str(expr))
    for xv in range(-40, 41, 7):
        for hv in range(-9, 30, 5):
            for bv in (1, 3, 8):
                bindings = {"x": xv, "h": hv, "batch": bv}
                want = build(xv, hv, bv)
                assert evaluate(expr, bindings) == want == evaluate(back, bindings), bindings


def test_value_range_is_exact_on_small_boxes_and_sound_on_large_ones() -> None:
    frames = ((x - 192) // 128 - sym_min((x - 192) // 128 + 1, 0)) // 4 + 1  # silero-vad's STFT frame count
    assert value_range(frames, {"x": (192, 703)}) == (1, 1)
    assert value_range(frames, {"x": (192, 704)}) == (1, 2)
    assert value_range(h - 2 * (h // 2) + (h % 3), {"h": (0, 10)}) == (0, 3)
    assert value_range(x * batch - batch, {"x": (1, 4), "batch": (1, 8)}) == (0, 24)
    # 2^20 points: interval arithmetic, which may be wider but must contain the exact range (0, 2).
    low, high = value_range(x % 2 + (h // 1024) % 2, {"x": (0, 1 << 10), "h": (0, 1 << 10)})
    assert low <= 0 and high >= 2
    assert value_range(x // (h - 3), {"x": (0, 9), "h": (0, 9)}) is None  # the divisor is 0 at h = 3
    assert value_range(x + h, {"x": (0, 9)}) is None  # h is unbounded


def test_expressions_of_remainders_alone_are_decided_over_one_period() -> None:
    """Symbols only inside remainders by constants make an expression periodic: one period decides it."""
    n, y = sym("n"), sym("y")
    assert -(((n % 2) + 1) // 2) + (n % 2) + 1 == 1  # ONNX's SAME padding of a stride-2 conv: constant
    assert type((x % 4 + y) % 2 - (x + y) % 2) is int
    assert not (-(n % 3) > 0) and (-(n % 3) <= 0)
    assert not ((2 * n) % 3 + n - 9 >= n)
    assert sym_max((n % 2) - 2, -5) == (n % 2) - 2
    assert isinstance((x // 3) % 2 - x % 2, SymDim)  # x//3 is not periodic: (x//3) % 2 has period 6, not 2
    with pytest.raises(EdgerunError, match="cannot decide"):
        _ = n % 3 > 1
    with pytest.raises(EdgerunError, match="cannot decide"):
        _ = n > 3
