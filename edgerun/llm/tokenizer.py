"""Byte-level BPE tokenizer (GPT-2 family) read from GGUF metadata or a Hugging Face tokenizer.json.

Encoding, as transformers' fast tokenizer does it for these models:
1. special (added) tokens such as `<|im_start|>` are cut out of the text first and become their ids;
2. the rest is split by the pre-tokenizer regex (GPT-2's, or llama-3's for `llama-bpe`);
3. each piece's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table);
4. BPE merges the lowest-ranked adjacent pair until none applies; the pieces become ids.
Decoding maps ids back to their strings, the characters back to bytes, and decodes UTF-8 (invalid
sequences, e.g. half an emoji, become U+FFFD as in transformers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import regex

from edgerun.errors import EdgerunError

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF tokenizer.ggml.pre -> pattern; anything else known to use GPT-2's split falls back to it.
_PRE_PATTERNS = {"llama-bpe": LLAMA3_PATTERN, "llama3": LLAMA3_PATTERN}
# GGUF token types: 3 = control, 4 = user-defined: both are matched whole before the regex split.
_ADDED_TYPES = (3, 4)


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (so BPE never sees whitespace or controls)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


class BPETokenizer:
    def __init__(self, tokens: Sequence[str], merges: Iterable[str], special_ids: Sequence[int], *,
                 pattern: str = GPT2_PATTERN, bos_id: int | None = None, eos_id: int | None = None,
                 add_bos: bool = False) -> None:
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            a, _, b = merge.partition(" ")
            # The halves as the vocabulary's own string objects, not two new ones per merge (5 MB for SmolLM2).
            self.ranks[(self._interned(a), self._interned(b))] = rank
        self.special_ids = sorted(set(special_ids))
        self.special = {self.tokens[i]: i for i in self.special_ids}
        # Longest first, so a special token that contains another wins.
        alternatives = sorted(self.special, key=len, reverse=True)
        self._special_split = regex.compile("(" + "|".join(regex.escape(s) for s in alternatives) + ")") \
            if alternatives else None
        self.pattern = pattern
        self._pattern = regex.compile(pattern)
        self._byte_map = byte_to_unicode()
        self._char_to_byte = {c: b for b, c in self._byte_map.items()}
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self._cache: dict[str, list[int]] = {}

    def _interned(self, piece: str) -> str:
        i = self.vocab.get(piece)
        return piece if i is None else self.tokens[i]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # ---- encode ----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise EdgerunError(f"encode() takes a str, got {type(text).__name__}")
        ids: list[int] = [self.bos_id] if self.add_bos and self.bos_id is not None else []
        parts = self._special_split.split(text) if self._special_split else [text]
        for k, part in enumerate(parts):
            if k % 2:  # the split's captured groups are the special tokens
                ids.append(self.special[part])
            elif part:
                for piece in self._pattern.findall(part):
                    ids += self._encode_piece(piece)
        return ids

    def _encode_piece(self, piece: str) -> list[int]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word = [self._byte_map[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best, best_rank = -1, None
            for i in range(len(word) - 1):
                rank = self.ranks.get((word[i], word[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = i, rank
            if best_rank is None:
                break
            pair = (word[best], word[best + 1])
            merged, i = [], 0
            while i < len(word):  # merge every occurrence of the best pair, left to right
                if i < len(word) - 1 and (word[i], word[i + 1]) == pair:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        try:
            ids = [self.vocab[w] for w in word]
        except KeyError as exc:
            raise EdgerunError(f"token {exc.args[0]!r} is not in the vocabulary") from None
        if len(self._cache) < 100_000:
            self._cache[piece] = ids
        return ids

    # ---- decode ----------------------------------------------------------------------------------------
    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise EdgerunError(f"token id {i} is outside the vocabulary of {len(self.tokens)}")
            if i in self.special_ids:
                if not skip_special:
                    out += self.tokens[i].encode("utf-8")
                continue
            for ch in self.tokens[i]:
                b = self._char_to_byte.get(ch)
                out += bytes([b]) if b is not None else ch.encode("utf-8")
        return bytes(out)

    def token_id(self, text: str) -> int | None:
        return self.vocab.get(text)


def tokenizer_from_gguf(meta: dict[str, Any]) -> BPETokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise EdgerunError(f"tokenizer model {model!r} is not supported yet (byte-level BPE, 'gpt2', is)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    special = [i for i, t in enumerate(types) if int(t) in _ADDED_TYPES]
    pattern = _PRE_PATTERNS.get(str(meta.get("tokenizer.ggml.pre", "default")), GPT2_PATTERN)
    return BPETokenizer(tokens, meta.get("tokenizer.ggml.merges") or [], special, pattern=pattern,
                        bos_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
                        eos_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
                        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))


def tokenizer_from_json(path: str, special: dict[str, int]) -> BPETokenizer:
    """A Hugging Face tokenizer.json with a byte-level BPE model."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise EdgerunError(f"{path!r}: only byte-level BPE tokenizers are supported")
    vocab: dict[str, int] = dict(model["vocab"])
    for added in spec.get("added_tokens", []):
        vocab[added["content"]] = int(added["id"])
    tokens = [""] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pattern = LLAMA3_PATTERN if r"\p{N}{1,3}" in json.dumps(spec.get("pre_tokenizer")) else GPT2_PATTERN
    return BPETokenizer(tokens, merges, [int(a["id"]) for a in spec.get("added_tokens", [])], pattern=pattern,
                        bos_id=special.get("bos"), eos_id=special.get("eos"))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
