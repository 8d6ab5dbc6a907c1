"""The Llama-family architecture: hyper-parameters read from GGUF metadata or a Hugging Face config.json.

One decoder covers the variants: llama (SmolLM2, Llama 2/3, Mistral without sliding window), qwen2 (adds
biases on the q/k/v projections) and phi3 (fused qkv and gate/up projections, split at import). Where a
variant needs something the program builder does not express (partial rotary embeddings, RoPE scaling,
sliding-window attention) the import refuses with a clear error rather than run a different model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgerun.errors import EdgerunError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "phi3", "mistral")


@dataclass(frozen=True)
class LlamaArchitecture:
    arch: str
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int  # the SwiGLU's inner width
    context: int  # the model's trained context length
    rope_theta: float
    eps: float
    qkv_bias: bool = False
    head_dim_override: int | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.heads

    @property
    def group(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.heads // self.kv_heads

    def check(self) -> None:
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise EdgerunError(f"architecture {self.arch!r} is not supported "
                               f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        if self.heads % self.kv_heads:
            raise EdgerunError(f"{self.heads} query heads do not divide into {self.kv_heads} key/value heads")
        if self.head_dim % 2:
            raise EdgerunError(f"head size {self.head_dim} must be even for rotary embeddings")


def from_gguf_metadata(meta: dict[str, Any], vocab_fallback: int) -> LlamaArchitecture:
    arch = str(meta.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise EdgerunError(f"GGUF architecture {arch!r} is not supported "
                           f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise EdgerunError(f"GGUF metadata lacks {arch}.{key}")
        return value

    heads = int(get("attention.head_count"))
    dim = int(get("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", dim // heads))
    rope_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise EdgerunError(f"partial rotary embeddings ({rope_dim} of {head_dim} dims) are not supported yet")
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise EdgerunError(f"RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported yet")
    if meta.get(f"{arch}.attention.sliding_window"):
        raise EdgerunError("sliding-window attention is not supported yet")
    config = LlamaArchitecture(
        arch=arch, vocab=int(meta.get(f"{arch}.vocab_size", vocab_fallback)), dim=dim,
        layers=int(get("block_count")), heads=heads, kv_heads=int(get("attention.head_count_kv", heads)),
        hidden=int(get("feed_forward_length")), context=int(get("context_length")),
        rope_theta=float(get("rope.freq_base", 10000.0)), eps=float(get("attention.layer_norm_rms_epsilon")),
        qkv_bias=arch == "qwen2", head_dim_override=head_dim if head_dim != dim // heads else None)
    config.check()
    return config


def from_hf_config(cfg: dict[str, Any]) -> LlamaArchitecture:
    arch = str(cfg.get("model_type", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise EdgerunError(f"model_type {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    rope = cfg.get("rope_parameters") or {}
    if cfg.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise EdgerunError(f"RoPE scaling {cfg.get('rope_scaling') or rope!r} is not supported yet")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise EdgerunError("partial rotary embeddings are not supported yet")
    if cfg.get("hidden_act", "silu") != "silu":
        raise EdgerunError(f"activation {cfg['hidden_act']!r} is not supported (SwiGLU with silu only)")
    if arch in ("qwen2", "mistral") and cfg.get("use_sliding_window", arch == "mistral") and cfg.get("sliding_window"):
        raise EdgerunError("sliding-window attention is not supported yet")
    heads = int(cfg["num_attention_heads"])
    dim = int(cfg["hidden_size"])
    theta = cfg.get("rope_theta") or rope.get("rope_theta", 10000.0)
    head_dim = cfg.get("head_dim")
    config = LlamaArchitecture(
        arch=arch, vocab=int(cfg["vocab_size"]), dim=dim, layers=int(cfg["num_hidden_layers"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), hidden=int(cfg["intermediate_size"]),
        context=int(cfg.get("max_position_embeddings", 2048)), rope_theta=float(theta),
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        head_dim_override=int(head_dim) if head_dim and int(head_dim) != dim // heads else None)
    config.check()
    return config
