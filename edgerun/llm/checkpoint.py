"""A checkpoint: architecture, weights under canonical names, and what the tokenizer needs.

Two sources: a GGUF file (weights may stay packed) and a Hugging Face model folder (config.json and
safetensors). Both end in the same canonical layout, so the program builder has one input:

    embed [vocab, dim]   final_norm [dim]   lm_head [vocab, dim] (absent when tied to embed)
    layers.{i}.{attn_norm, mlp_norm} [dim]
    layers.{i}.{q, k, v, o, gate, up, down} [out, in]   layers.{i}.{q_bias, k_bias, v_bias} [out] (qwen2)

with q and k rows in Hugging Face order (rotate-half RoPE). llama.cpp's converter interleaves the rotary
pairs of llama's q/k rows; we undo that row permutation, which moves packed rows intact.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.llm.architecture import Architecture, from_gguf_metadata, from_hf_config
from edgerun.llm.gguf_reader import Tensor, file_digest, read_gguf
from edgerun.llm.quant_blocks import PackedWeight

_GGUF_LAYER_NAMES = {"attn_norm": "attn_norm", "ffn_norm": "mlp_norm", "attn_q": "q", "attn_k": "k",
                     "attn_v": "v", "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
                     "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "post_attention_norm": "attn_post_norm",
                     "post_ffw_norm": "mlp_post_norm"}
_HF_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
                   "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v",
                   "self_attn.o_proj": "o", "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down",
                   "self_attn.qkv_proj": "qkv", "mlp.gate_up_proj": "gate_up",
                   "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm"}
# Families with norms on both sides of each branch name them differently: post_attention_layernorm is the
# attention's post-norm there, not the MLP's pre-norm.
_HF_POST_NORM_NAMES = {**_HF_LAYER_NAMES, "post_attention_layernorm": "attn_post_norm",
                       "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"}


@dataclass
class Checkpoint:
    config: Architecture
    weights: dict[str, Tensor] = field(repr=False)
    source: str
    digest: str  # sha256 of the GGUF file, or of the folder's config and weight files
    tokenizer_metadata: dict[str, Any] = field(default_factory=dict, repr=False)  # GGUF tokenizer.* keys
    tokenizer_json: str | None = None  # a Hugging Face tokenizer.json, for folders
    chat_template: str | None = None
    special: dict[str, int] = field(default_factory=dict)  # bos / eos / pad token ids

    @property
    def tied(self) -> bool:
        return "lm_head" not in self.weights

    def float_weight(self, name: str) -> np.ndarray:
        w = self.weights[name]
        return w.dequantize() if isinstance(w, PackedWeight) else w

    @property
    def packed_names(self) -> list[str]:
        return [n for n, w in self.weights.items() if isinstance(w, PackedWeight)]


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    path = os.fspath(path)
    if os.path.isdir(path):
        return _from_hf_folder(path)
    if not os.path.exists(path):
        raise EdgerunError(f"no model at {path!r} (expected a .gguf file or a Hugging Face model folder)")
    return _from_gguf(path)


# ---- GGUF ------------------------------------------------------------------------------------------------


def _from_gguf(path: str) -> Checkpoint:
    contents = read_gguf(path)
    meta = contents.metadata
    tokens = meta.get("tokenizer.ggml.tokens") or []
    # Llama 3.1's RoPE scaling, as llama.cpp stores it: a factor per frequency (rope_freqs.weight).
    factors = contents.tensors.pop("rope_freqs.weight", None)
    config = from_gguf_metadata(meta, vocab_fallback=len(tokens),
                                freq_factors=() if factors is None else
                                tuple(float(f) for f in np.ravel(np.asarray(factors, np.float32))))
    weights: dict[str, Tensor] = {}
    for name, tensor in contents.tensors.items():
        weights.update(_gguf_tensor(name, tensor, config))
    _check_complete(weights, config, path)
    # eot/eom: the end of a turn and of a tool message, which llama.cpp stops at like eos.
    special = {role: int(meta[f"tokenizer.ggml.{role}_token_id"]) for role in ("bos", "eos", "padding", "eot", "eom")
               if f"tokenizer.ggml.{role}_token_id" in meta}
    return Checkpoint(config, weights, path, file_digest(path),
                      tokenizer_metadata={k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")},
                      chat_template=meta.get("tokenizer.chat_template") or config.family.chat_template,
                      special=special)


def _gguf_tensor(name: str, tensor: Tensor, config: Architecture) -> dict[str, Tensor]:
    top = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
    if name in top:
        return {top[name]: tensor}
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] not in ("weight", "bias"):
        raise EdgerunError(f"GGUF tensor {name!r} is not part of a {config.arch} model")
    layer, kind, suffix = int(parts[1]), parts[2], parts[3]
    prefix = f"layers.{layer}."
    if kind == "attn_qkv":  # phi3: q, k, v rows stacked
        q_rows, kv_rows = config.heads * config.head_dim, config.kv_heads * config.head_dim
        return {prefix + n: _rows(tensor, a, b) for n, (a, b) in
                {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows),
                 "v": (q_rows + kv_rows, q_rows + 2 * kv_rows)}.items()}
    if kind == "ffn_up" and _nrows(tensor) == 2 * config.hidden:  # phi3: gate then up
        return {prefix + "gate": _rows(tensor, 0, config.hidden),
                prefix + "up": _rows(tensor, config.hidden, 2 * config.hidden)}
    canonical = _GGUF_LAYER_NAMES.get(kind)
    if canonical is None:
        raise EdgerunError(f"GGUF tensor {name!r} ({kind}) is not supported for {config.arch}")
    if config.family.gguf_permuted_qk and canonical in ("q", "k"):
        heads = config.heads if canonical == "q" else config.kv_heads
        tensor = _take_rows(tensor, _unpermute_order(heads, config.head_dim))
    return {prefix + canonical + ("_bias" if suffix == "bias" else ""): tensor}


def _unpermute_order(heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns llama.cpp's interleaved rotary pairs back into rotate-half halves.

    llama.cpp row (h, i, j) for i < head_dim/2, j in {0, 1} holds HF row (h, j, i).
    """
    idx = np.arange(heads * head_dim).reshape(heads, head_dim // 2, 2)
    return idx.transpose(0, 2, 1).reshape(-1)


def _nrows(t: Tensor) -> int:
    return t.shape[0]


def _take_rows(t: Tensor, order: np.ndarray) -> Tensor:
    return t.take_rows(order) if isinstance(t, PackedWeight) else t[order]


def _rows(t: Tensor, start: int, stop: int) -> Tensor:
    return _take_rows(t, np.arange(start, stop))


def _check_complete(weights: dict[str, Tensor], config: Architecture, source: str) -> None:
    need = ["embed", "final_norm"]
    for i in range(config.layers):
        need += [f"layers.{i}.{n}" for n in ("attn_norm", "mlp_norm", "q", "k", "v", "o", "gate", "up", "down")]
        if config.qk_norm:
            need += [f"layers.{i}.q_norm", f"layers.{i}.k_norm"]
        if config.post_norms:
            need += [f"layers.{i}.attn_post_norm", f"layers.{i}.mlp_post_norm"]
        if config.qkv_bias:
            need += [f"layers.{i}.{n}_bias" for n in ("q", "k", "v")]
    missing = [n for n in need if n not in weights]
    if missing:
        raise EdgerunError(f"{source!r} lacks weights {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    expected = {"embed": (config.vocab, config.dim), "layers.0.q": (config.heads * config.head_dim, config.dim),
                "layers.0.k": (config.kv_heads * config.head_dim, config.dim),
                "layers.0.gate": (config.hidden, config.dim), "layers.0.down": (config.dim, config.hidden)}
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise EdgerunError(f"{source!r}: weight {name} has shape {tuple(weights[name].shape)}, "
                               f"the architecture needs {shape}")


# ---- Hugging Face folder ---------------------------------------------------------------------------------


def _from_hf_folder(path: str) -> Checkpoint:
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise EdgerunError(f"{path!r} has no config.json (expected a Hugging Face model folder)")
    with open(config_path) as f:
        hf = json.load(f)
    config = from_hf_config(hf)
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise EdgerunError(f"{path!r} has no .safetensors weights")
    from edgerun.llm.safetensors_file import read_safetensors

    weights: dict[str, Tensor] = {}
    for name in files:
        for key, array in read_safetensors(os.path.join(path, name)).items():
            weights.update(_hf_tensor(key, array, config))
    if hf.get("tie_word_embeddings", True) is True:
        weights.pop("lm_head", None)
    _check_complete(weights, config, path)
    digest = file_digest(config_path)
    tokenizer_json = os.path.join(path, "tokenizer.json")
    template = None
    tok_config = os.path.join(path, "tokenizer_config.json")
    special: dict[str, int] = {}
    generation = os.path.join(path, "generation_config.json")
    gen_config: dict[str, Any] = {}
    if os.path.exists(generation):
        with open(generation) as f:
            gen_config = json.load(f)
    for key, role in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = gen_config.get(key, hf.get(key))
        values = value if isinstance(value, list) else [] if value is None else [value]
        for k, v in enumerate(values):  # several eos ids (Llama 3's end of turn, of message): all stop
            special[role if k == 0 else f"{role}_{k}"] = int(v)
    if os.path.exists(tok_config):
        with open(tok_config) as f:
            template = json.load(f).get("chat_template")
    jinja = os.path.join(path, "chat_template.jinja")  # where transformers 5 saves it
    if template is None and os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            template = f.read()
    for name in files:
        digest = file_digest(os.path.join(path, name)) + digest
    import hashlib

    return Checkpoint(config, weights, path, hashlib.sha256(digest.encode()).hexdigest(),
                      tokenizer_json=tokenizer_json if os.path.exists(tokenizer_json) else None,
                      chat_template=template or (config.family.chat_template if tokenizer_json else None),
                      special=special)


def _hf_tensor(key: str, array: np.ndarray, config: Architecture) -> dict[str, Tensor]:
    array = array.astype(np.float32, copy=False)
    if key.endswith("norm.weight") and config.family.norm_offset:  # gemma applies (1 + w)
        array = array + np.float32(config.family.norm_offset)
    top = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
    if key in top:
        return {top[key]: array}
    if key.endswith("rotary_emb.inv_freq"):
        return {}
    parts = key.split(".")
    if len(parts) < 5 or parts[:2] != ["model", "layers"]:
        raise EdgerunError(f"safetensors weight {key!r} is not part of a {config.arch} model")
    layer, inner, suffix = int(parts[2]), ".".join(parts[3:-1]), parts[-1]
    canonical = (_HF_POST_NORM_NAMES if config.post_norms else _HF_LAYER_NAMES).get(inner)
    if canonical is None:
        raise EdgerunError(f"safetensors weight {key!r} ({inner}) is not supported for {config.arch}")
    prefix = f"layers.{layer}."
    if canonical == "qkv":
        q, kv = config.heads * config.head_dim, config.kv_heads * config.head_dim
        return {prefix + "q": array[:q], prefix + "k": array[q:q + kv], prefix + "v": array[q + kv:]}
    if canonical == "gate_up":
        return {prefix + "gate": array[:config.hidden], prefix + "up": array[config.hidden:]}
    return {prefix + canonical + ("_bias" if suffix == "bias" else ""): array}
