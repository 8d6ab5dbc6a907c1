"""The decoder's forward pass as an edgerun graph: one "step" over a chunk of T tokens with a KV cache.

One block for every family (families.py): pre-norm attention and gated MLP with residual adds; per the
architecture's options, post-norms on both branches, QK-norm, partial or scaled rotary embeddings (a table
per rotary base: gemma3's sliding layers have their own), a sliding window on some layers, soft-capped
attention scores and logits, GELU-tanh gating, the embedding scaled by sqrt(dim).

Each layer's attention is one `cache_attention` op (edgerun/ir/ops/cache_attention_ops.py): the q/k/v
projections' outputs (after QK-norm) in, with the rotary tables of the layer's base, its window and soft-cap
as attributes; the layer's cache read and its T new rows written at the run-time position `start`. A backend
with an attention kernel runs it whole (ONNX Runtime: GroupQueryAttention, appending the rows in place);
elsewhere its decomposition runs. The builder knows nothing of backends.

Prefill is the step at a chunk length (the prompt in chunks, the last padded: the causal mask keeps the
padding out of real tokens' attention); decode is the step at T=1. The cache is program state: per layer
the states `k_cache_{i}`, `v_cache_{i}`, updated by the layer's op (only the T new rows, in place; the step
must satisfy start + T <= C, see step_runner.py).

Inputs:  tokens int64[T], start int64[1] (position of tokens[0]), last int64[1] (row whose logits to emit)
Cache, in one of two layouts (`layout`):
  "heads" (what `edgerun.llm` runs): k_cache_{i} and v_cache_{i} float32[1, kv_heads, C, head_dim], ONNX
      Runtime's GroupQueryAttention layout;
  "keys_transposed" (the WebGPU decode plan's): k_cache_{i} float32[kv_heads, head_dim, C] (the score matmul
      needs no transpose), v_cache_{i} float32[kv_heads, C, head_dim].
Outputs: logits float32[vocab] (or [T, vocab] with all_logits)

Cache slots at positions >= start are masked out (they must hold finite values: 0 * NaN is NaN).
GGUF-packed weights stay packed (see `packed_linear`).

A batched decode (`slots` = B > 1, `batched_decode_graph`): B sequences, one token each, in one call. Its cache
is B slots, per layer the states `k_slots_{i}`, `v_slots_{i}` float32[B, kv_heads, C, head_dim] ("heads"),
each slot one sequence's rows; tokens int64[B], start int64[B] (each sequence's own position; every layer's
cache_attention takes them as per-sequence lengths), logits float32[B, vocab]. The projections and the MLP
run on the B rows as one matrix. A sequence's prompt runs through `prefill` into the single-sequence cache,
and `slot_commit_graph` copies that cache into a slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.llm.architecture import Architecture
from edgerun.llm.quant_blocks import GROUP, Int4Operands, PackedWeight, int4_operands, wide_as_two_int4

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
Weight = np.ndarray | PackedWeight
CacheLayout = Literal["heads", "keys_transposed"]


def cache_names(config: Architecture) -> list[str]:
    """The cache states' names, layer by layer: k_cache_0, v_cache_0, k_cache_1, ..."""
    return [f"{kind}_cache_{i}" for i in range(config.layers) for kind in ("k", "v")]


def slot_cache_names(config: Architecture) -> list[str]:
    """The batched decode's cache states, layer by layer: k_slots_0, v_slots_0, k_slots_1, ..."""
    return [f"{kind}_slots_{i}" for i in range(config.layers) for kind in ("k", "v")]


def cache_specs(config: Architecture, context: int, layout: CacheLayout = "keys_transposed", slots: int = 0,
                ) -> dict[str, TensorSpec]:
    """The cache states' specs: the single-sequence cache, or with `slots` the batched decode's ("heads")."""
    kv, hd = config.kv_heads, config.head_dim
    if slots:
        return {name: TensorSpec((slots, kv, context, hd), DType.float32) for name in slot_cache_names(config)}
    if layout == "heads":
        return {name: TensorSpec((1, kv, context, hd), DType.float32) for name in cache_names(config)}
    return {name: TensorSpec((kv, hd, context) if name.startswith("k") else (kv, context, hd), DType.float32)
            for name in cache_names(config)}


def inverse_frequencies(config: Architecture, base: float) -> np.ndarray:
    """The rotary frequencies in float32 as transformers computes them, with linear or Llama 3 scaling and
    llama.cpp's per-frequency factors (its rope_freqs tensor) applied."""
    rd = config.rotary_dim
    exponents = np.arange(0, rd, 2).astype(np.float32) / np.float32(rd)
    inv_freq: np.ndarray = (1.0 / (np.float32(base) ** exponents)).astype(np.float32)
    if len(config.rope_scaling) == 1:
        inv_freq = inv_freq / np.float32(config.rope_scaling[0])
    elif len(config.rope_scaling) == 4:  # Llama 3.1: long wavelengths slowed by factor, short ones kept
        factor, low, high, original = (np.float32(v) for v in config.rope_scaling)
        low_wavelen, high_wavelen = original / low, original / high
        wavelen = (np.float32(2 * np.pi) / inv_freq).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.asarray(np.where(medium, smoothed, scaled), np.float32)
    if config.rope_freq_factors:
        inv_freq = inv_freq / np.asarray(config.rope_freq_factors, np.float32)
    return inv_freq.astype(np.float32)


def rope_tables(config: Architecture, context: int, base: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [context, rotary_dim], computed in float32 in the order transformers uses."""
    inv_freq = inverse_frequencies(config, config.rope_theta if base is None else base)
    angles = np.arange(context, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _StepBuilder:
    def __init__(self, config: Architecture, weights: Mapping[str, Weight], chunk: int, context: int,
                 all_logits: bool, int8_activations: bool, shared: dict[str, list[Int4Operands]],
                 layout: CacheLayout, slots: int = 0) -> None:
        self.shared, self.layout, self.slots = shared, layout, slots
        self.c, self.w, self.T, self.C, self.all_logits = config, weights, chunk, context, all_logits or slots > 0
        self.n = chunk * max(slots, 1)  # rows: every sequence's tokens
        self.int4_attrs = {"activations": "int8"} if int8_activations else {}
        self.g = Graph()
        self.b = Builder(self.g)
        self._transposed: dict[str, str] = {}
        self.start = ""

    def weight_t(self, name: str) -> str:
        """The [in, out] constant of weight `name` (stored [out, in]), so a projection is one matmul."""
        if name not in self._transposed:
            data = self.w.get(name + ".T")
            if data is None:
                w = self.w[name]
                data = np.ascontiguousarray((w.dequantize() if isinstance(w, PackedWeight) else w).T)
            assert isinstance(data, np.ndarray)
            self._transposed[name] = self.g.add_constant(data, name=name + ".T")
        return self._transposed[name]

    def const(self, name: str) -> str:
        if name not in self.g.specs:
            w = self.w[name]
            data = w.dequantize() if isinstance(w, PackedWeight) else w
            self.g.add_constant(np.ascontiguousarray(data, dtype=np.float32), name=name)
        return name

    def constant(self, data: np.ndarray, name: str) -> str:
        """`data` as the constant `name`, once: the embedding gather and the tied head read the same ones."""
        if name in self.g.constants:
            assert self.g.constants[name] is data, name
            return name
        return self.g.add_constant(data, name=name)

    def int4_matmul(self, x: str, ops: Int4Operands, name: str, scales_name: str | None = None) -> str:
        n, groups, half = ops.packed.shape
        group = 2 * half  # 32, or 16 for Q6_K
        if ops.input_scale != 1.0:
            x = self.b.binary("mul", x, self.b.scalar(ops.input_scale, x))
        ins = [x, self.constant(ops.packed, name + ".codes"), self.constant(ops.scales, scales_name or name + ".scales")]
        if ops.zeros is not None:
            ins.append(self.constant(ops.zeros, name + ".zeros"))
        y = self.b.emit("matmul_int4", ins, k=groups * group, n=n, group_size=group, **self.int4_attrs)
        if ops.offsets is None:
            return y
        b = self.b  # + (x summed per group) @ offsets.T, as one [N, K/32] @ [K/32, 1] product per row (why: below)
        rows = self.rows(x)
        sums = b.emit("reduce_sum", [b.emit("reshape", [x], shape=[rows, groups, group])], axes=[2], keepdims=True)
        offsets = self.g.add_constant(ops.offsets, name=name + ".offsets")
        # A batched decode's row must equal the single decode's bit for bit (int8 activations turn any
        # last-bit difference into different roundings, docs/llm.md), so each row is a product of its own:
        # ONNX Runtime's float MatMul [rows, K/32] @ [K/32, N] takes a one-row kernel for one row and SGEMM for
        # several, which round differently.
        term = b.emit("matmul", [offsets, sums])  # [rows, N, 1]
        return b.binary("add", y, b.emit("reshape", [term], shape=[rows, n]))

    def projections(self, x: str, names: list[str]) -> list[str]:
        """x @ w.T for each weight; packed weights of one scheme run as one stacked matmul, then split
        (q/k/v, gate/up: one int4 GEMV instead of several small ones, and fewer nodes per token)."""
        ws = [self.w.get(n) for n in names]
        packed = [w for w in ws if isinstance(w, PackedWeight)]
        if len(packed) < len(ws) or len({w.scheme for w in packed}) != 1 or packed[0].bits != 4:
            return [self.linear(x, n) for n in names]
        y = self.packed_linear(x, "+".join(names), lambda: PackedWeight.stack(packed))
        outs, start = [], 0
        for name, w in zip(names, packed):
            part = self.b.emit("slice", [y], starts=[start], ends=[start + w.shape[0]], axes=[1])
            if name + "_bias" in self.w:
                part = self.b.binary("add", part, self.const(name + "_bias"))
            outs.append(part)
            start += w.shape[0]
        return outs

    def rows(self, x: str) -> int:
        return self.b.shape(x)[0]

    def packed_operands(self, name: str, w: PackedWeight | Callable[[], PackedWeight]) -> list[Int4Operands]:
        """The matmul_int4 operands of weight `name`: int4 as one set, int8 as two (its nibbles). Made once per
        weight for all the programs built with the same `shared` dict (prefill and decode hold the same
        arrays, not two copies); `w` may be a function making the weight then."""
        if name not in self.shared:
            weight = w() if callable(w) else w
            self.shared[name] = [int4_operands(weight)] if weight.bits == 4 else list(wide_as_two_int4(weight))
        return self.shared[name]

    def packed_linear(self, x: str, name: str, w: PackedWeight | Callable[[], PackedWeight]) -> str:
        """x @ w.T with w kept as the GGUF packed it: int4 as one matmul_int4, int8 as two (its nibbles)."""
        ops = self.packed_operands(name, w)
        if len(ops) == 1:
            return self.int4_matmul(x, ops[0], name)
        shared_scales = name + ".low.scales" if ops[0].scales is ops[1].scales else None  # one constant, not two
        return self.b.binary("add", self.int4_matmul(x, ops[0], name + ".high", shared_scales),
                             self.int4_matmul(x, ops[1], name + ".low"))

    def linear(self, x: str, name: str) -> str:
        w = self.w.get(name)
        if isinstance(w, PackedWeight):
            y = self.packed_linear(x, name, w)
        else:
            y = self.b.emit("matmul", [x, self.weight_t(name)])
        if name + "_bias" in self.w:
            y = self.b.binary("add", y, self.const(name + "_bias"))
        return y

    def embed(self, tokens: str) -> str:
        """The embedding rows of `tokens`; a Q8_0 table stays packed and only the gathered rows are scaled.

        The rows are gathered from the head's operands (`wide_as_two_int4`: the codes' high and low nibbles,
        two per byte), not from a second int8 copy of the table: with a tied head that copy was 28 MB of
        SmolLM2's weights. Per byte, the odd element's nibble is `floor(byte / 16)` and the even one's
        `byte - 16 * odd` (no `mod`: ONNX Runtime does not claim it in float); code + 128 = 16 * high + low,
        all exact in float32."""
        b, w = self.b, self.w["embed"]
        if not (isinstance(w, PackedWeight) and w.scheme == "q8_0"):
            return b.emit("gather", [self.const("embed"), tokens], axis=0)
        high, low = self.packed_operands("embed", w)
        groups = w.shape[1] // GROUP

        def nibbles(ops: Int4Operands, name: str) -> tuple[str, str]:
            packed = b.emit("cast", [b.emit("gather", [self.constant(ops.packed, name), tokens], axis=0)],
                            dtype="float32")  # [T, groups, GROUP / 2]
            odd = b.unary("floor", b.binary("div", packed, b.scalar(16.0, packed)))
            return b.binary("sub", packed, b.binary("mul", odd, b.scalar(16.0, packed))), odd

        (high_even, high_odd), (low_even, low_odd) = nibbles(high, "embed.high.codes"), nibbles(low, "embed.low.codes")
        sixteen = b.scalar(16.0, high_even)
        pairs = [b.emit("reshape", [b.binary("add", b.binary("mul", h, sixteen), lo)], shape=[self.n, groups, GROUP // 2, 1])
                 for h, lo in ((high_even, low_even), (high_odd, low_odd))]
        codes = b.binary("sub", b.emit("reshape", [b.emit("concat", pairs, axis=3)], shape=[self.n, groups, GROUP]),
                         b.scalar(128.0, high_even))
        scales = b.emit("reshape", [b.emit("gather", [self.constant(low.scales, "embed.low.scales"), tokens], axis=0)],
                        shape=[self.n, groups, 1])
        return b.emit("reshape", [b.binary("mul", codes, scales)], shape=[self.n, w.shape[1]])

    def rms_norm(self, x: str, name: str) -> str:
        return self.b.emit("rms_norm", [x, self.const(name)], eps=self.c.eps)

    def attention(self, h: str, i: int, tables: tuple[str, str]) -> str:
        """Layer i's attention as one `cache_attention` op (ir/ops/cache_attention_ops.py: rotary, grouped
        heads, causal and cache masks, the layer's window and soft-cap, the cache read and its new rows
        written); QK-norm before it. Its cache outputs are the layer's state updates."""
        b, c, prefix = self.b, self.c, f"layers.{i}."
        q, k, v = self.projections(h, [prefix + "q", prefix + "k", prefix + "v"])
        q, k = self.qk_norm(q, c.heads, prefix + "q_norm"), self.qk_norm(k, c.kv_heads, prefix + "k_norm")
        kind = "slots" if self.slots else "cache"
        k_name, v_name = f"k_{kind}_{i}", f"v_{kind}_{i}"
        attrs: dict[str, object] = {"head_dim": c.head_dim, "layout": self.layout, "scale": float(np.float32(c.scale))}
        if c.is_sliding(i):
            attrs["window"] = c.sliding_window
        if c.attn_softcap:
            attrs["softcap"] = float(c.attn_softcap)
        out, k_cache, v_cache = b.emit_multi("cache_attention", [q, k, v, self.cache_read(k_name),
                                                                 self.cache_read(v_name), self.start, *tables], **attrs)
        self.g.state_updates[k_name], self.g.state_updates[v_name] = k_cache, v_cache
        return self.linear(out, prefix + "o")

    def qk_norm(self, x: str, heads: int, name: str) -> str:
        """QK-norm (qwen3, gemma3): an RMSNorm per head over head_dim of [T, heads * head_dim]."""
        if not self.c.qk_norm:
            return x
        b, hd = self.b, self.c.head_dim
        per_head = b.emit("reshape", [x], shape=[self.n, heads, hd])
        return b.emit("reshape", [self.rms_norm(per_head, name)], shape=[self.n, heads * hd])

    def softcap(self, x: str, cap: float) -> str:
        """cap * tanh(x / cap) (gemma2's logits); x itself without a cap."""
        if not cap:
            return x
        b = self.b
        return b.binary("mul", b.unary("tanh", b.binary("div", x, b.scalar(cap, x))), b.scalar(cap, x))

    def cache_read(self, name: str) -> str:
        """Layer cache `name`: a program state, read as a view of the state's buffer."""
        self.g.specs[name] = cache_specs(self.c, self.C, self.layout, self.slots)[name]
        self.g.state_inputs.append(name)
        return name

    def mlp(self, h: str, i: int) -> str:
        b, prefix = self.b, f"layers.{i}."
        gate, up = self.projections(h, [prefix + "gate", prefix + "up"])
        act = b.emit("silu", [gate]) if self.c.activation == "silu" else b.emit("gelu", [gate], approximate="tanh")
        return self.linear(b.binary("mul", act, up), prefix + "down")

    def build(self) -> Graph:
        b, g, c, C = self.b, self.g, self.c, self.C
        tokens = g.add_input("tokens", TensorSpec((self.n,), DType.int64))
        self.start = g.add_input("start", TensorSpec((max(self.slots, 1),), DType.int64))
        last = "" if self.slots else g.add_input("last", TensorSpec((1,), DType.int64))
        tables: dict[float, tuple[str, str]] = {}
        for base in dict.fromkeys(c.rope_base(i) for i in range(c.layers)):  # gemma3's sliding layers: their own
            cos_table, sin_table = rope_tables(c, C, base)  # [C, rotary_dim]: the rows of positions 0 .. C - 1
            tables[base] = (g.add_constant(cos_table, name=f"rope_cos_{len(tables)}"),
                            g.add_constant(sin_table, name=f"rope_sin_{len(tables)}"))
        x = self.embed(tokens)  # [rows, dim]
        if c.embed_scale:
            x = b.binary("mul", x, b.scalar(float(np.float32(np.sqrt(c.dim))), x))
        for i in range(c.layers):
            attn = self.attention(self.rms_norm(x, f"layers.{i}.attn_norm"), i, tables[c.rope_base(i)])
            if c.post_norms:
                attn = self.rms_norm(attn, f"layers.{i}.attn_post_norm")
            x = b.binary("add", x, attn)
            mlp = self.mlp(self.rms_norm(x, f"layers.{i}.mlp_norm"), i)
            if c.post_norms:
                mlp = self.rms_norm(mlp, f"layers.{i}.mlp_post_norm")
            x = b.binary("add", x, mlp)
        h = self.rms_norm(x, "final_norm")
        if not self.all_logits:
            h = b.emit("gather", [h, last], axis=0)  # [1, dim]: only the row generation needs
        head = "lm_head" if "lm_head" in self.w else "embed"  # [vocab, dim]; tied shares embed
        head_weight = self.w[head]
        if isinstance(head_weight, PackedWeight):
            logits = self.packed_linear(h, head, head_weight)
        else:  # [vocab, dim] @ h.T: the float head is never copied transposed
            logits = b.emit("transpose", [b.emit("matmul", [self.const(head), b.emit("transpose", [h], perm=[1, 0])])],
                            perm=[1, 0])
        logits = self.softcap(logits, c.final_softcap)
        if not self.all_logits:
            logits = b.emit("reshape", [logits], shape=[c.vocab])
        g.outputs = [logits]
        return g


def step_graph(config: Architecture, weights: Mapping[str, Weight], *, chunk: int, context: int,
               all_logits: bool = False, int8_activations: bool = False,
               shared: dict[str, list[Int4Operands]] | None = None,
               layout: CacheLayout = "keys_transposed") -> Graph:
    """The step program for `chunk` tokens against a cache of `context` positions, held as state in `layout`.

    Float weights become float matmuls; PackedWeight ones stay packed (matmul_int4; the Q8_0 embedding as
    int8 rows scaled after the gather). `int8_activations` rounds the packed matmuls' inputs to int8 per
    group of 32 (llama.cpp's Q8 activations): faster for one-token decoding, not for prefill's GEMMs.
    Graphs built with one `shared` dict share their packed operands (stacked, split, offsets) array for array.
    """
    graph = _StepBuilder(config, weights, chunk, context, all_logits, int8_activations,
                         {} if shared is None else shared, layout).build()
    _rename_outputs(graph, ["logits"])
    return graph


def batched_decode_graph(config: Architecture, weights: Mapping[str, Weight], *, slots: int, context: int,
                         int8_activations: bool = False, shared: dict[str, list[Int4Operands]] | None = None,
                         ) -> Graph:
    """One decode step of `slots` sequences (module doc): tokens [slots], start [slots] -> logits [slots, vocab],
    each sequence against its own slot of the `k_slots_{i}`/`v_slots_{i}` caches."""
    if slots < 2:
        raise ValueError(f"a batched decode needs at least 2 slots, got {slots}")
    graph = _StepBuilder(config, weights, 1, context, True, int8_activations, {} if shared is None else shared,
                         "heads", slots).build()
    _rename_outputs(graph, ["logits"])
    return graph


def slot_commit_graph(config: Architecture, *, slots: int, context: int) -> Graph:
    """slot int64[1] -> slot: the single-sequence cache ("heads") copied whole into slot `slot` of the batched
    decode's caches (a prompt prefilled there joins the batch). update_slice on the slot axis: written in place."""
    g = Graph()
    slot = g.add_input("slot", TensorSpec((1,), DType.int64))
    b = Builder(g)
    single, batched = cache_specs(config, context, "heads"), cache_specs(config, context, slots=slots)
    for source, target in zip(single, batched):
        g.specs[source], g.specs[target] = single[source], batched[target]
        g.state_inputs += [source, target]
        g.state_updates[target] = b.emit("update_slice", [target, source, slot], axis=0)
    g.outputs = [b.emit("reshape", [slot], shape=[1])]
    _rename_outputs(g, ["slot"])
    return g


def _rename_outputs(graph: Graph, names: list[str]) -> None:
    """Give the outputs stable names (what the runner and a program file's reader look them up by)."""
    from edgerun.passes.pipeline import restore_output_names

    restore_output_names(graph, names)
