"""The GGUF tokenizer against transformers' tokenizer on the same file, and the chat template."""

from __future__ import annotations

import random

import pytest

from edgerun.errors import EdgerunError

FIXED = [
    "Hello world", " leading space", "trailing space ", "  two  spaces  between", "\n\n\nnewlines\n",
    "\t tabs\t\tand spaces \t", "    ", "", "a", "I'm sure you're right; they'll see. We've, I'd, it's.",
    "DON'T SHOUT'S", "1234567890 and 3.14159 and 1,000,000", "x=1+2*3-4/5**6", "🎉🎉 emoji 👍🏽 family 👨‍👩‍👧",
    "日本語のテキスト", "한국어 문장", "Ελληνικά κείμενα", "Привет, мир!", "مرحبا بالعالم", "naïve café résumé",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "text<|endoftext|>more", "<|im_end|><|im_start|>",
    "<repo_name>owner/repo<file_sep>main.py", "half a tag <|im_sta and more", "https://example.com/a?b=c&d=e#f",
    "\u00a0non-breaking\u2009thin\u200bzero-width", "tab\there\r\nwindows line", "😀" * 10, "ab" * 50,
    "The quick brown fox jumps over the lazy dog.", "   \n  \n", "$$$ %%% ^^^", "'''quoted'''", "camelCaseWord",
    "snake_case_word", "__dunder__", "path/to/file.txt", "e-mail: someone@example.org", "C++ and C# and F#",
]


def _random_strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" \n\t  ") +
                list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + list("éüñçßøåæœ") + list("中文日本語한국") +
                ["😀", "🎉", "👍🏽", "\u200d", "\u00a0"] + ["<|im_start|>", "<|im_end|>", "'s", "'ll"])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


STRINGS = FIXED + _random_strings(300)


def test_token_ids_match_transformers(smollm, hf_tokenizer) -> None:
    mismatches = [(s, smollm.tokenizer.encode(s), hf_tokenizer.encode(s)) for s in STRINGS
                  if smollm.tokenizer.encode(s) != hf_tokenizer.encode(s)]
    assert not mismatches[:3], f"{len(mismatches)} of {len(STRINGS)} strings differ"
    assert len(STRINGS) >= 300


def test_decode_matches_transformers_and_round_trips(smollm, hf_tokenizer) -> None:
    for s in STRINGS:
        ids = smollm.tokenizer.encode(s)
        assert smollm.tokenizer.decode(ids) == hf_tokenizer.decode(ids)
        assert smollm.tokenizer.decode(ids) == s


def test_special_tokens_become_their_ids(smollm) -> None:
    tok = smollm.tokenizer
    assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.decode([1, 2]) == "<|im_start|><|im_end|>"
    assert tok.decode([1, 2], skip_special=True) == ""
    with pytest.raises(EdgerunError, match="outside the vocabulary"):
        tok.decode([10**6])


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke 🎉\n\nwith two lines"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(smollm, hf_tokenizer, messages) -> None:
    ours = smollm.apply_chat_template(messages)
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert smollm.tokenizer.encode(ours) == hf_tokenizer.encode(theirs)


def test_bad_messages_get_clear_errors(smollm) -> None:
    for bad in ([], "hi", [{"role": "user"}], [{"role": "robot", "content": "x"}]):
        with pytest.raises(EdgerunError):
            smollm.apply_chat_template(bad)


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma):
    return gemma.tokenizer  # the model's (tests/llm/test_gemma3.py loads it anyway)


def test_gemma_sentencepiece_ids_match_transformers(gemma_tokenizer, gemma_reference) -> None:
    """Gemma 3's SentencePiece BPE (byte fallback, merges rebuilt from the vocabulary's order, BOS added):
    transformers' ids on the same GGUF, recorded by bench/llm_gemma3_reference.py, for every string above."""
    want = gemma_reference["tokenizer"]
    assert set(want) == set(STRINGS)
    mismatches = [(s, gemma_tokenizer.encode(s), ids) for s, ids in want.items() if gemma_tokenizer.encode(s) != ids]
    assert not mismatches[:3], f"{len(mismatches)} of {len(want)} strings differ"
    for s in STRINGS[:60]:
        assert gemma_tokenizer.decode(gemma_tokenizer.encode(s), skip_special=True) == s
    # Streaming decodes token by token as bytes: byte-fallback pieces join into the character.
    ids = gemma_tokenizer.encode("naïve 🎉 日本")[1:]
    assert b"".join(gemma_tokenizer.decode_bytes([i]) for i in ids).decode("utf-8") == "naïve 🎉 日本"
    # A text that writes BOS itself (a chat template) gets one BOS, not two.
    assert gemma_tokenizer.encode("<bos>Hi")[:2] == [2, gemma_tokenizer.encode("Hi")[1]]


def _tiny_bpe_metadata(**changes):
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab", "<s>"],
            "tokenizer.ggml.token_type": [1, 1, 1, 3], "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.bos_token_id": 3}
    return {**meta, **changes}


@pytest.mark.parametrize("changes, message", [
    ({"tokenizer.ggml.token_type": [1, 1, 1]}, "token_type has 3 entries for 4 tokens"),
    ({"tokenizer.ggml.bos_token_id": 9}, "bos_token_id = 9 is outside the vocabulary"),
    ({"tokenizer.ggml.merges": ["a c"]}, "the merge 'a' \\+ 'c'"),
    ({"tokenizer.ggml.merges": ["ab"]}, "not two tokens"),
    ({"tokenizer.ggml.model": "bert"}, "tokenizer model 'bert' is not supported \\(supported: gpt2, llama\\)"),
])
def test_inconsistent_tokenizer_metadata_is_a_clear_error(changes, message) -> None:
    from edgerun.llm.tokenizer import tokenizer_from_gguf

    assert tokenizer_from_gguf(_tiny_bpe_metadata()).encode("ab<s>a") == [2, 3, 0]
    with pytest.raises(EdgerunError, match=message):
        tokenizer_from_gguf(_tiny_bpe_metadata(**changes))
