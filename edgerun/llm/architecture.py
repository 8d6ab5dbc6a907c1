"""A decoder's hyper-parameters and options, read from GGUF metadata or a Hugging Face config.json.

`Architecture` is everything the program builder needs to know about a checkpoint: the widths, and the
options of its family (families.py) with the checkpoint's numbers filled in (the window of sliding layers,
soft-caps, the rotary base and scaling, the attention scale). What a family or checkpoint asks for that the
builder does not express (another activation, RoPE scaling other than linear or Llama 3's, ...) is refused
with a clear error naming it and what is supported, rather than run as a different model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.llm.families import HF_MODEL_TYPES, SUPPORTED, Family, family

ROPE_SCALINGS = ("none", "linear", "llama3")


@dataclass(frozen=True)
class Architecture:
    arch: str  # the family (families.py)
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int  # the gated MLP's inner width
    context: int  # the model's trained context length
    rope_theta: float
    eps: float
    qkv_bias: bool = False
    head_dim_override: int | None = None
    activation: str = "silu"
    qk_norm: bool = False
    post_norms: bool = False
    embed_scale: bool = False
    rotary_dim_override: int | None = None  # partial rotary: the first rotary_dim dims of each head rotate
    rope_scaling: tuple[float, ...] = ()  # (factor,) linear; (factor, low, high, original context) llama3
    rope_freq_factors: tuple[float, ...] = ()  # llama.cpp's rope_freqs tensor: each frequency divided by one
    sliding_window: int = 0  # 0: none
    sliding_layers: tuple[int, ...] = ()  # the layers that attend over the window
    local_rope_theta: float = 0.0  # the sliding layers' rotary base when it differs (gemma3); 0: the same
    attn_softcap: float = 0.0  # scores -> cap * tanh(scores / cap) (gemma2); 0: none
    final_softcap: float = 0.0  # the logits likewise
    query_scale: float = 0.0  # q is multiplied by this; 0: 1/sqrt(head_dim)

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.heads

    @property
    def rotary_dim(self) -> int:
        return self.rotary_dim_override or self.head_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.heads // self.kv_heads

    @property
    def scale(self) -> float:
        return self.query_scale or 1.0 / math.sqrt(self.head_dim)

    @property
    def family(self) -> Family:
        return family(self.arch)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding_window) and layer in self.sliding_layers

    def rope_base(self, layer: int) -> float:
        return self.local_rope_theta if self.local_rope_theta and self.is_sliding(layer) else self.rope_theta

    def check(self) -> None:
        family(self.arch)
        if self.heads % self.kv_heads:
            raise EdgerunError(f"{self.heads} query heads do not divide into {self.kv_heads} key/value heads")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise EdgerunError(f"rotary size {self.rotary_dim} must be even and at most the head size {self.head_dim}")
        if self.activation not in ("silu", "gelu_tanh"):
            raise EdgerunError(f"activation {self.activation!r} is not supported (silu, gelu_tanh)")

    def to_json(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v, tuple) else v for f in fields(self) for v in [getattr(self, f.name)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Architecture:
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)


def _sliding_layers(fam: Family, layers: int, layer_types: list[str] | None) -> tuple[int, ...]:
    if layer_types is not None:
        return tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if fam.sliding == "all":
        return tuple(range(layers))
    if fam.sliding == "alternate":
        return tuple(range(0, layers, 2))
    if fam.sliding == "pattern":
        return tuple(i for i in range(layers) if (i + 1) % fam.swa_pattern)
    return ()


def from_gguf_metadata(meta: dict[str, Any], vocab_fallback: int, freq_factors: tuple[float, ...] = ()) -> Architecture:
    arch = str(meta.get("general.architecture", "?"))
    fam = family(arch, "GGUF architecture")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise EdgerunError(f"GGUF metadata lacks {arch}.{key}")
        return value

    heads = int(get("attention.head_count"))
    dim = int(get("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", dim // heads))
    if int(meta.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise EdgerunError("keys and values of different widths are not supported")
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    scaling_type = str(meta.get(f"{arch}.rope.scaling.type", "none") or "none")
    scaling: tuple[float, ...] = ()
    if scaling_type == "linear":
        scaling = (float(get("rope.scaling.factor")),)
    elif scaling_type != "none":
        raise EdgerunError(f"RoPE scaling {scaling_type!r} is not supported (supported: none, linear, and Llama 3's "
                           f"frequency factors)")
    window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0) if fam.sliding != "none" else 0
    layers = int(get("block_count"))
    softcap = float(meta.get(f"{arch}.attn_logit_softcapping", 0.0) or 0.0)
    config = Architecture(
        arch=arch, vocab=int(meta.get(f"{arch}.vocab_size", vocab_fallback)), dim=dim,
        layers=layers, heads=heads, kv_heads=int(get("attention.head_count_kv", heads)),
        hidden=int(get("feed_forward_length")), context=int(get("context_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)), eps=float(get("attention.layer_norm_rms_epsilon")),
        qkv_bias=fam.qkv_bias, head_dim_override=head_dim if head_dim != dim // heads else None,
        activation=fam.activation, qk_norm=fam.qk_norm, post_norms=fam.post_norms, embed_scale=fam.embed_scale,
        rotary_dim_override=rope_dim if rope_dim != head_dim else None, rope_scaling=scaling,
        rope_freq_factors=freq_factors, sliding_window=window,
        sliding_layers=_sliding_layers(fam, layers, None) if window else (),
        local_rope_theta=fam.local_rope_theta or 0.0, attn_softcap=softcap,
        final_softcap=float(meta.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
        # llama.cpp scales gemma queries by 1/sqrt(head_dim) (query_pre_attn_scalar is not in the file)
        query_scale=0.0)
    config.check()
    return config


def _hf_rope(params: dict[str, Any], cfg: dict[str, Any]) -> tuple[float, tuple[float, ...]]:
    """(rope theta, scaling) from a rope_parameters dict (transformers 5) or rope_theta / rope_scaling."""
    params = {**params, **(cfg.get("rope_scaling") or {})}
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if kind == "default":
        return theta, ()
    if kind == "linear":
        return theta, (float(params["factor"]),)
    if kind == "llama3":
        return theta, (float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]),
                       float(params["original_max_position_embeddings"]))
    raise EdgerunError(f"RoPE scaling {kind!r} is not supported (supported: default, linear, llama3)")


def from_hf_config(cfg: dict[str, Any]) -> Architecture:
    model_type = str(cfg.get("model_type", "?"))
    arch = HF_MODEL_TYPES.get(model_type)
    if arch is None:
        raise EdgerunError(f"model_type {model_type!r} is not supported (supported: {SUPPORTED})")
    fam = family(arch)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
    act = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}.get(act, act)
    if act != fam.activation:
        raise EdgerunError(f"activation {act!r} is not supported for {arch} (it runs {fam.activation})")
    heads, dim, layers = int(cfg["num_attention_heads"]), int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or dim // heads)
    rope = cfg.get("rope_parameters") or {}
    local_theta = 0.0
    if "full_attention" in rope:  # gemma3: one set of parameters per layer kind
        theta, scaling = _hf_rope(rope["full_attention"], {})
        local_theta, local_scaling = _hf_rope(rope.get("sliding_attention", {}), {})
        if local_scaling:
            raise EdgerunError("RoPE scaling on sliding layers is not supported")
    else:
        theta, scaling = _hf_rope(rope, cfg)
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    rotary = int(head_dim * partial)
    window = int(cfg.get("sliding_window") or 0)
    if arch in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = 0  # their configs name a window that only use_sliding_window turns on
    sliding: tuple[int, ...] = ()
    if window:
        layer_types = cfg.get("layer_types")
        sliding = _sliding_layers(fam, layers, layer_types)
        if layer_types is None and fam.sliding == "none":  # a window in the config applies to every layer
            sliding = tuple(range(layers))
    scalar = cfg.get("query_pre_attn_scalar")
    config = Architecture(
        arch=arch, vocab=int(cfg["vocab_size"]), dim=dim, layers=layers, heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), hidden=int(cfg["intermediate_size"]),
        context=int(cfg.get("max_position_embeddings", 2048)), rope_theta=theta,
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(cfg.get("attention_bias", fam.qkv_bias)),
        head_dim_override=head_dim if head_dim != dim // heads else None,
        activation=fam.activation, qk_norm=fam.qk_norm, post_norms=fam.post_norms, embed_scale=fam.embed_scale,
        rotary_dim_override=rotary if rotary != head_dim else None, rope_scaling=scaling,
        sliding_window=window if sliding else 0, sliding_layers=sliding,
        local_rope_theta=local_theta if local_theta and local_theta != theta else 0.0,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        query_scale=float(scalar) ** -0.5 if fam.query_scale_from == "query_pre_attn_scalar" and scalar else 0.0)
    config.check()
    return config
