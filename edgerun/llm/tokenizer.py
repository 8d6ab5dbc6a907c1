"""The model's tokenizer: Hugging Face's `tokenizers` library, built from GGUF metadata or read from a
Hugging Face folder's tokenizer.json.

`tokenizers` is the implementation transformers' fast tokenizers run, so ids match transformers' for the
same model by construction rather than by a hand-written copy of each algorithm. A GGUF stores no
tokenizer.json, only llama.cpp's metadata (`tokenizer.ggml.*`); `tokenizer_from_gguf` builds the same
pipeline transformers builds from those keys (transformers/integrations/gguf/gguf_tokenizer_mapping.py):

- `gpt2`: byte-level BPE; the vocabulary and ranked merges as stored; the split regex named by
  `tokenizer.ggml.pre` (llama-3's for `llama-bpe`/`llama3`, GPT-2's built into ByteLevel otherwise);
- `llama`: SentencePiece BPE with byte fallback (`<0xNN>` tokens); the merges the file lacks are rebuilt
  from the vocabulary, ranked by score (Llama 2, Mistral) or, for the Gemma family, whose scores do not
  follow the merge order, by position in the vocabulary; Gemma stores runs of spaces as spaces, which
  become `▁` runs; Llama-style files get the `▁` prefix space (`tokenizer.ggml.add_space_prefix`).

Control tokens (GGUF token type 3) become special added tokens, user-defined ones (4) plain added tokens:
both are matched whole in the text. `tokenizer.ggml.add_bos_token` adds the BOS id in front, once: a text
that already starts with the BOS token (a chat template that writes it) does not get a second one.
Metadata that cannot describe one tokenizer (lists of different lengths, a special id outside the
vocabulary, a merge of tokens not in it) is an EdgerunError naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from edgerun.errors import EdgerunError

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF tokenizer.ggml.pre -> split regex; any other byte-level vocabulary splits with GPT-2's.
_PRE_PATTERNS = {"llama-bpe": LLAMA3_PATTERN, "llama3": LLAMA3_PATTERN, "llama-v3": LLAMA3_PATTERN,
                 "smaug-bpe": LLAMA3_PATTERN, "falcon3": LLAMA3_PATTERN, "dbrx": LLAMA3_PATTERN}
SUPPORTED_GGUF_MODELS = ("gpt2", "llama")
_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types


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


class Tokenizer:
    """A `tokenizers.Tokenizer` with the ids and byte-level decoding the generation loop needs.

    `kind` is "byte_level" or "sentencepiece": how a token's text maps back to bytes when decoding one
    token at a time (streaming holds back half a UTF-8 character, which a whole-text decode would turn
    into U+FFFD). `split_pattern` is the byte-level pre-tokenizer's regex (the browser tokenizer has
    GPT-2's only), None for SentencePiece.
    """

    def __init__(self, backend: Any, *, kind: str, bos_id: int | None = None, eos_id: int | None = None,
                 split_pattern: str | None = None) -> None:
        if kind not in ("byte_level", "sentencepiece"):
            raise EdgerunError(f"tokenizer kind {kind!r} is not supported (byte_level, sentencepiece)")
        self.backend, self.kind, self.split_pattern = backend, kind, split_pattern
        vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
        self.tokens = [""] * (max(vocab.values()) + 1)
        for text, i in vocab.items():
            self.tokens[i] = text
        added = backend.get_added_tokens_decoder()
        self.special_ids = sorted(i for i, t in added.items() if t.special)
        self.added_ids = frozenset(added)
        self.bos_id, self.eos_id = bos_id, eos_id
        self._char_to_byte = {c: b for b, c in byte_to_unicode().items()}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def add_bos(self) -> bool:
        """Whether encode() puts the BOS id in front (the post-processor's template says so)."""
        return self.bos_id is not None and self.backend.encode("").ids[:1] == [self.bos_id]

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise EdgerunError(f"encode() takes a str, got {type(text).__name__}")
        ids: list[int] = self.backend.encode(text).ids
        if self.bos_id is not None and ids[:2] == [self.bos_id, self.bos_id] and text.startswith(self.tokens[self.bos_id]):
            ids = ids[1:]  # the text wrote BOS itself (a chat template): not twice
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        ids = self._checked(ids)
        return str(self.backend.decode(ids, skip_special_tokens=skip_special))

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """The bytes of the tokens' text, token by token (a token may hold part of a UTF-8 character)."""
        out = bytearray()
        for i in self._checked(ids):
            if i in self.added_ids:
                if not (skip_special and i in self.special_ids):
                    out += self.tokens[i].encode("utf-8")
            else:
                out += self._token_bytes(self.tokens[i])
        return bytes(out)

    def _token_bytes(self, token: str) -> bytes:
        if self.kind == "byte_level":
            if all(c in self._char_to_byte for c in token):
                return bytes(self._char_to_byte[c] for c in token)
            return token.encode("utf-8")
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])  # SentencePiece byte fallback
        return token.replace("\u2581", " ").encode("utf-8")

    def _checked(self, ids: Iterable[int]) -> list[int]:
        out = [int(i) for i in ids]
        for i in out:
            if not 0 <= i < len(self.tokens):
                raise EdgerunError(f"token id {i} is outside the vocabulary of {len(self.tokens)}")
        return out

    def token_id(self, text: str) -> int | None:
        i = self.backend.token_to_id(text)
        return None if i is None else int(i)

    def bpe_merges(self) -> list[str]:
        """The BPE model's merges, best first, as "a b" strings (for the browser's tokenizer)."""
        merges = json.loads(self.backend.to_str())["model"].get("merges", [])
        return [m if isinstance(m, str) else " ".join(m) for m in merges]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokenizer": json.loads(self.backend.to_str()), "bos_id": self.bos_id,
                "eos_id": self.eos_id, "split_pattern": self.split_pattern}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        return cls(Backend.from_str(json.dumps(data["tokenizer"])), kind=data["kind"], bos_id=data.get("bos_id"),
                   eos_id=data.get("eos_id"), split_pattern=data.get("split_pattern"))


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    model = meta.get("tokenizer.ggml.model")
    if model not in SUPPORTED_GGUF_MODELS:
        raise EdgerunError(f"tokenizer model {model!r} is not supported (supported: {', '.join(SUPPORTED_GGUF_MODELS)})")
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    n = len(tokens)
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type") or [1] * n]
    _check_length(types, n, "tokenizer.ggml.token_type")
    special = {role: _special_id(meta, key, n) for role, key in
               (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"))}
    arch = str(meta.get("general.architecture", ""))
    split_pattern = None
    if model == "gpt2":
        kind = "byte_level"
        alphabet = set(byte_to_unicode().values())
        spelling = byte_to_unicode()
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
                 for i, t in enumerate(tokens)}
        merges = [_merge_pair(m) for m in meta.get("tokenizer.ggml.merges") or []]
        _check_merges(merges, vocab)
        backend = Backend(models.BPE(vocab, merges, dropout=None, fuse_unk=False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        split_pattern = _PRE_PATTERNS.get(pre, GPT2_PATTERN)
        if split_pattern == GPT2_PATTERN:
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        control_ok = alphabet  # a "control" token spelled outside the byte alphabet is llama.cpp's mislabel
    else:
        kind = "sentencepiece"
        gemma = arch in _GEMMA_ARCHITECTURES
        if gemma:  # runs of spaces are stored as spaces; the model's merges spell them as ▁
            tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        vocab = {t: i for i, t in enumerate(tokens)}
        if meta.get("tokenizer.ggml.merges"):
            merges = [_merge_pair(m) for m in meta["tokenizer.ggml.merges"]]
            _check_merges(merges, vocab)
        elif gemma:  # Gemma's scores do not follow its merge order; the vocabulary's order does
            merges = _merges_from_vocab(vocab, {t: -i for i, t in enumerate(tokens)})
        else:
            scores = [float(s) for s in meta.get("tokenizer.ggml.scores") or []]
            _check_length(scores, n, "tokenizer.ggml.scores")
            merges = _merges_from_vocab(vocab, dict(zip(tokens, scores)))
        unk = tokens[special["unk"]] if special["unk"] is not None else None
        backend = Backend(models.BPE(vocab, merges, fuse_unk=True, byte_fallback=True, dropout=None, unk_token=unk))
        if gemma:
            backend.normalizer = normalizers.Replace(" ", "\u2581")
            backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
            backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                 decoders.Fuse()])
        else:
            prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                             prepend_scheme="first" if prefix else "never", split=False)
            steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            backend.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))
        control_ok = None
    _add_tokens(backend, tokens, types, special, control_ok, vocab)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
    if add_bos and special["bos"] is not None:
        from tokenizers import processors

        bos = tokens[special["bos"]]
        backend.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1",
                                                               special_tokens=[(bos, special["bos"])])
    return Tokenizer(backend, kind=kind, bos_id=special["bos"], eos_id=special["eos"], split_pattern=split_pattern)


def _add_tokens(backend: Any, tokens: list[str], types: list[int], special: dict[str, int | None],
                control_ok: set[str] | None, vocab: dict[str, int]) -> None:
    """Control tokens (and bos/eos/unk) as special added tokens, user-defined ones as plain added tokens:
    both matched whole before the model sees the text."""
    from tokenizers import AddedToken

    roles = {i for i in special.values() if i is not None}
    control = [AddedToken(t, normalized=False, special=True) for i, (t, kind) in enumerate(zip(tokens, types))
               if (kind == _CONTROL or i in roles) and (control_ok is None or set(t) <= control_ok)]
    backend.add_special_tokens(control)
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, kind in zip(tokens, types)
                        if kind == _USER_DEFINED and t in vocab])


def _merges_from_vocab(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE vocabulary implies (transformers' generate_merges, same order): every
    split of a token into two vocabulary pieces, best token score first."""
    merges: list[tuple[str, str, float]] = []
    for token, score in scores.items():
        if len(token) < 2:
            continue
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        if len(local) > 1:
            local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += local
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _merge_pair(merge: str) -> tuple[str, str]:
    a, sep, b = str(merge).partition(" ")
    if not sep or not a or not b:
        raise EdgerunError(f"GGUF tokenizer.ggml.merges holds {merge!r}, not two tokens separated by a space")
    return a, b


def _check_merges(merges: list[tuple[str, str]], vocab: dict[str, int]) -> None:
    for a, b in merges:
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise EdgerunError(f"GGUF tokenizer metadata is inconsistent: the merge {a!r} + {b!r} uses or makes a "
                               f"token not in tokenizer.ggml.tokens")


def _check_length(values: Sequence[Any], n: int, key: str) -> None:
    if len(values) != n:
        raise EdgerunError(f"GGUF tokenizer metadata is inconsistent: {key} has {len(values)} entries for "
                           f"{n} tokens")


def _special_id(meta: dict[str, Any], key: str, n: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if not 0 <= int(value) < n:
        raise EdgerunError(f"GGUF tokenizer metadata is inconsistent: tokenizer.ggml.{key} = {int(value)} is "
                           f"outside the vocabulary of {n} tokens")
    return int(value)


def tokenizer_from_json(path: str, special: dict[str, int]) -> Tokenizer:
    """A Hugging Face folder's tokenizer.json, run as written (its pre-tokenizer, post-processor, decoder)."""
    from tokenizers import Tokenizer as Backend

    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        backend = Backend.from_str(json.dumps(spec))
    except (OSError, ValueError, Exception) as exc:
        raise EdgerunError(f"{path!r}: cannot read the tokenizer: {exc}") from None
    decoder = json.dumps(spec.get("decoder"))
    if "ByteLevel" in decoder:
        kind = "byte_level"
        pre = json.dumps(spec.get("pre_tokenizer"))
        pattern = LLAMA3_PATTERN if r"\\p{N}{1,3}" in pre else GPT2_PATTERN if "ByteLevel" in pre else None
    elif "ByteFallback" in decoder or "Metaspace" in decoder:
        kind, pattern = "sentencepiece", None
    else:
        raise EdgerunError(f"{path!r}: tokenizer with decoder {decoder} is not supported "
                           f"(byte-level BPE and SentencePiece are)")
    return Tokenizer(backend, kind=kind, bos_id=special.get("bos"), eos_id=special.get("eos"), split_pattern=pattern)
