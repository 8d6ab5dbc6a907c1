"""Structured output through llguidance (Microsoft's grammar engine, a Rust library on PyPI with no further
Python dependencies; xgrammar, the other maintained engine, pulls torch, transformers and triton).

A request asks for it with OpenAI's `response_format` (`{"type": "json_object"}`, or `{"type":
"json_schema", "json_schema": {"name", "schema", "strict"}}`), or with llama-server's `grammar` (GBNF) or a
`regex` (the whole output matches it). llguidance compiles that into a matcher over the model's vocabulary;
before each sampled token the matcher's bitmask sets the logits of every token that would break the grammar
to -inf, and the chosen token is fed back. The model's end-of-sequence token is allowed only where the output
is complete, and generation ends when the grammar allows nothing more.

JSON is generated compact (no free whitespace: llguidance's `whitespace_flexible` off) unless the schema's
own `x-guidance` options say otherwise: free whitespace lets a model pad forever before closing a brace.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.llm.tokenizer import Tokenizer

JSON_OPTIONS: Any = {"whitespace_flexible": False}  # llguidance.JsonCompileOptions
ANY_JSON_OBJECT = {"type": "object"}


class GrammarConstraint:
    """One request's matcher; `mask`, `consume`, `finished` as engine.Constraint asks."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        """`vocab`: the size of llguidance's tokenizer (the bitmask's); logits past it are never allowed."""
        import llguidance.numpy

        self.matcher = matcher
        self._bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab)
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self._bits = np.arange(32, dtype=np.uint32)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        self._fill(self.matcher, self._bitmask)
        self._check()
        words = self._bitmask[0].view(np.uint32)
        allowed = ((words[:, None] >> self._bits) & 1).astype(bool).reshape(-1)[:logits.shape[-1]]
        out = np.asarray(logits, np.float32).copy()
        out[:allowed.size][~allowed] = -np.inf
        out[allowed.size:] = -np.inf  # the program's vocabulary may be padded past the tokenizer's
        return out

    def consume(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()

    def finished(self) -> bool:
        return bool(self.matcher.is_stopped())

    def _check(self) -> None:
        if self.matcher.is_error():
            raise EdgerunError(f"structured output: {self.matcher.get_error()}")


class GrammarCompiler:
    """Builds matchers for one tokenizer. llguidance's tokenizer (the vocabulary as bytes, its token trie) is
    made once, on the first structured request (about 0.6 s for SmolLM2's 49,152 tokens)."""

    def __init__(self, tokenizer: Tokenizer | None, eos_token_id: int | None, stop_token_ids: list[int],
                 max_grammar_chars: int) -> None:
        self.tokenizer, self.eos = tokenizer, eos_token_id
        self.stop_ids, self.max_chars = stop_token_ids, max_grammar_chars
        self._lock = threading.Lock()
        self._ll: Any = None

    def grammar_for(self, response_format: dict[str, Any] | None, grammar: str | None,
                    regex: str | None) -> str | None:
        """llguidance's grammar text for a request's options, or None when it asks for free text."""
        asked = [x for x in (grammar, regex) if x is not None]
        kind = (response_format or {}).get("type", "text")
        if kind != "text":
            asked.append(kind)
        if len(asked) > 1:
            raise EdgerunError("give one of response_format, grammar and regex")
        if not asked:
            return None
        import llguidance
        from llguidance.gbnf_to_lark import gbnf_to_lark

        if grammar is not None:
            self._size(grammar, "grammar")
            try:
                return str(llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(grammar)))
            except Exception as exc:
                raise EdgerunError(f"grammar: not valid GBNF: {exc}") from None
        if regex is not None:
            self._size(regex, "regex")
            return str(llguidance.LLMatcher.grammar_from_regex(regex))
        if kind == "json_object":
            schema: Any = ANY_JSON_OBJECT
        elif kind == "json_schema":
            spec = (response_format or {}).get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise EdgerunError("response_format.json_schema must be {'name': ..., 'schema': {...}}")
            schema = spec.get("schema", {})
        else:
            raise EdgerunError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
        self._size(json.dumps(schema), "response_format.json_schema")
        try:
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
        except ValueError as exc:
            raise EdgerunError(f"response_format.json_schema: {exc}") from None

    def constraint(self, grammar: str) -> GrammarConstraint:
        """A matcher for `grammar`; a grammar llguidance refuses (or one past its resource limits) is a clear
        error. Blocks for up to a few hundred ms on a large schema: call it off the event loop."""
        import llguidance

        ll = self._tokenizer()
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        if matcher.is_error():
            raise EdgerunError(f"structured output: {matcher.get_error()}")
        return GrammarConstraint(matcher, ll.vocab_size)

    def _size(self, text: str, what: str) -> None:
        if len(text) > self.max_chars:
            raise EdgerunError(f"{what} is longer than this server's limit of {self.max_chars} characters")

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                self._ll = make_ll_tokenizer(self.tokenizer, self.eos, self.stop_ids)
            return self._ll


def make_ll_tokenizer(tokenizer: Tokenizer | None, eos_token_id: int | None, stop_token_ids: list[int]) -> Any:
    """llguidance's view of our byte-level BPE tokenizer: every token's bytes, the special ids, and our own
    encoder (llguidance uses it to re-tokenise text it forces)."""
    import llguidance

    if tokenizer is None or eos_token_id is None:
        raise EdgerunError("structured output needs the model's tokenizer and end-of-sequence token")

    class _Vocabulary:
        def __init__(self, tokenizer: Tokenizer, eos_token_id: int) -> None:
            self.tokenizer, self.eos_token_id, self.bos_token_id = tokenizer, eos_token_id, tokenizer.bos_id
            self.tokens = [tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)]
            self.special_token_ids = list(tokenizer.special_ids)

        def __call__(self, text: str | bytes) -> list[int]:
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            return self.tokenizer.encode(text)

    eos = sorted({eos_token_id, *stop_token_ids})
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer, eos_token_id)), eos_token=eos)
