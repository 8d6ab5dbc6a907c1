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


def test_merge_pairs_share_the_vocabulary_strings() -> None:
    """The merge table keys on the vocabulary's own string objects (SmolLM2: 5 MB less than two new strings
    per merge); a merge half outside the vocabulary is kept as written, and encoding is unchanged."""
    from edgerun.llm.tokenizer import BPETokenizer

    tokens = ["a", "b", "ab", "c", "abc"]
    tok = BPETokenizer(tokens, ["a" + " " + "b", "ab c", "x y"], [])
    for a, b in tok.ranks:
        if a in tok.vocab:
            assert a is tok.tokens[tok.vocab[a]] and b is tok.tokens[tok.vocab[b]]
    assert ("x", "y") in tok.ranks and tok.ranks[("ab", "c")] == 1
    assert tok.encode("abc") == [4] and tok.encode("ab") == [2] and tok.encode("ba") == [1, 0]
