"""cache_attention (ir/ops/cache_attention_ops.py) against the same attention written in torch: the cache
rows before `start` and the new rows concatenated, rotated keys and queries (partial rotary), grouped heads
(repeat_interleave), an explicit window-and-causal mask, soft-capped scores; and the caches' new rows."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret

torch = pytest.importorskip("torch")

T, C, HEADS, KV, HD, RD = 3, 10, 4, 2, 8, 4


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot, rest = x[..., :RD], x[..., RD:]
    half = torch.cat([-rot[..., RD // 2:], rot[..., :RD // 2]], dim=-1)
    return torch.cat([rot * cos + half * sin, rest], dim=-1)


@pytest.mark.parametrize(("layout", "window", "softcap"), [("heads", 0, 0.0), ("heads", 4, 2.0),
                                                           ("keys_transposed", 2, 0.0)])
def test_cache_attention_matches_torch(layout: str, window: int, softcap: float) -> None:
    rng = np.random.default_rng(0)
    start = 5
    q, k, v = (rng.standard_normal((T, n * HD)).astype(np.float32) for n in (HEADS, KV, KV))
    keys, values = rng.standard_normal((2, KV, C, HD)).astype(np.float32)  # [kv, C, hd]
    angles = np.arange(C, dtype=np.float32)[:, None] * rng.uniform(0.1, 1, RD // 2).astype(np.float32)
    cos, sin = (np.concatenate([f(angles)] * 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    if layout == "heads":
        k_cache, v_cache = keys[None], values[None]
    else:
        k_cache, v_cache = np.ascontiguousarray(keys.transpose(0, 2, 1)), values
    g = Graph()
    names = [g.add_input(n, TensorSpec(a.shape, "float32")) for n, a in
             (("q", q), ("k", k), ("v", v), ("kc", k_cache), ("vc", v_cache))]
    s = g.add_input("start", TensorSpec((1,), "int64"))
    tables = [g.add_constant(cos, name="cos"), g.add_constant(sin, name="sin")]
    g.outputs = Builder(g).emit_multi("cache_attention", [*names, s, *tables], head_dim=HD, layout=layout,
                                      scale=0.3, window=window, softcap=softcap)
    out, k_out, v_out = interpret(g, [q, k, v, k_cache, v_cache, np.array([start])])

    pos = torch.arange(start, start + T)
    tq = rotate(torch.from_numpy(q).view(T, HEADS, HD).transpose(0, 1), torch.from_numpy(cos)[pos],
                torch.from_numpy(sin)[pos])
    tk = rotate(torch.from_numpy(k).view(T, KV, HD).transpose(0, 1), torch.from_numpy(cos)[pos],
                torch.from_numpy(sin)[pos])
    tv = torch.from_numpy(v).view(T, KV, HD).transpose(0, 1)
    all_k = torch.cat([torch.from_numpy(keys)[:, :start], tk], dim=1).repeat_interleave(HEADS // KV, dim=0)
    all_v = torch.cat([torch.from_numpy(values)[:, :start], tv], dim=1).repeat_interleave(HEADS // KV, dim=0)
    scores = tq @ all_k.transpose(1, 2) * 0.3
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    key_pos = torch.arange(start + T)
    allowed = key_pos[None, :] <= pos[:, None]
    if window:
        allowed &= key_pos[None, :] > pos[:, None] - window
    want = (torch.softmax(scores.masked_fill(~allowed, -torch.inf), dim=-1) @ all_v).transpose(0, 1).reshape(T, -1)
    np.testing.assert_allclose(out, want.numpy(), atol=1e-5, rtol=1e-5)

    new_keys = keys.copy()
    new_keys[:, start:start + T] = tk.numpy()
    new_values = values.copy()
    new_values[:, start:start + T] = tv.numpy()
    got_keys = k_out[0] if layout == "heads" else k_out.transpose(0, 2, 1)
    np.testing.assert_allclose(got_keys, new_keys, atol=1e-6)
    np.testing.assert_allclose(v_out.reshape(KV, C, HD), new_values, atol=1e-6)


def test_cache_attention_refuses_a_cache_of_the_other_layout() -> None:
    g = Graph()
    ins = [g.add_input(n, TensorSpec(s, "float32")) for n, s in
           (("q", (T, HEADS * HD)), ("k", (T, KV * HD)), ("v", (T, KV * HD)), ("kc", (KV, HD, C)), ("vc", (KV, C, HD)))]
    ins.append(g.add_input("start", TensorSpec((1,), "int64")))
    with pytest.raises(ValueError, match=r"heads caches must be \(1, 2, 10, 8\)"):
        Builder(g).emit_multi("cache_attention", ins, head_dim=HD, layout="heads")


@pytest.mark.parametrize(("rows", "window", "softcap"), [(1, 0, 0.0), (2, 3, 2.0)])
def test_sequences_in_one_call_equal_each_alone(rows: int, window: int, softcap: float) -> None:
    """Caches of B sequences, each at its own start (one past its end: the 9th at the last cell, clamped as
    update_slice clamps): each sequence's output and cache rows equal the single-sequence op on its own cache
    (the op above, checked against torch), bit for bit."""
    rng = np.random.default_rng(1)
    starts = np.array([0, 5, 2, C - rows, C])
    batch = len(starts)
    q, k, v = (rng.standard_normal((batch * rows, n * HD)).astype(np.float32) for n in (HEADS, KV, KV))
    k_cache, v_cache = rng.standard_normal((2, batch, KV, C, HD)).astype(np.float32)
    angles = np.arange(C, dtype=np.float32)[:, None] * rng.uniform(0.1, 1, RD // 2).astype(np.float32)
    cos, sin = (np.concatenate([f(angles)] * 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    attrs = {"head_dim": HD, "layout": "heads", "scale": 0.3, "window": window, "softcap": softcap}

    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, kc: np.ndarray, vc: np.ndarray, s: np.ndarray,
            ) -> list[np.ndarray]:
        g = Graph()
        names = [g.add_input(n, TensorSpec(a.shape, "float32")) for n, a in
                 (("q", q), ("k", k), ("v", v), ("kc", kc), ("vc", vc))]
        tables = [g.add_constant(cos, name="cos"), g.add_constant(sin, name="sin")]
        g.outputs = Builder(g).emit_multi("cache_attention", [*names, g.add_input("start", TensorSpec(s.shape, "int64")),
                                                              *tables], **attrs)
        return list(interpret(g, [q, k, v, kc.copy(), vc.copy(), s]))

    out, k_out, v_out = run(q, k, v, k_cache, v_cache, starts)
    for i, s in enumerate(starts):
        part = slice(i * rows, (i + 1) * rows)
        alone = run(q[part], k[part], v[part], k_cache[i:i + 1], v_cache[i:i + 1], np.array([s]))
        if s + rows <= C:  # (the clamped sequence's rotary positions differ from its written cells, as alone)
            np.testing.assert_array_equal(out[part], alone[0])
        np.testing.assert_array_equal(k_out[i:i + 1], alone[1])
        np.testing.assert_array_equal(v_out[i:i + 1], alone[2])


def test_sequences_need_one_start_each() -> None:
    g = Graph()
    ins = [g.add_input(n, TensorSpec(s, "float32")) for n, s in
           (("q", (4, HEADS * HD)), ("k", (4, KV * HD)), ("v", (4, KV * HD)), ("kc", (4, KV, C, HD)),
            ("vc", (4, KV, C, HD)))]
    ins.append(g.add_input("start", TensorSpec((1,), "int64")))
    with pytest.raises(ValueError, match="start must be 4 int32 or int64 value"):
        Builder(g).emit_multi("cache_attention", ins, head_dim=HD, layout="heads")
