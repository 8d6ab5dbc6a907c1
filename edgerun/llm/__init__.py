"""LLM inference with real weights: GGUF / Hugging Face import, tokenizer, Llama programs, generation, serving.

    import edgerun.llm
    model = edgerun.llm.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    model.tokenizer.encode("Hello")                     # -> list[int]
    result = model.generate("Once upon a time", max_new_tokens=32, temperature=0.0)
    result.token_ids, result.text
    model.chat([{"role": "user", "content": "Hi"}])

docs/llm.md has the design: one program with methods `prefill` and `decode` and the KV cache as its state.
"""

from edgerun.llm.generation import GenerationResult
from edgerun.llm.model import LanguageModel, load
from edgerun.llm.sampling import SamplingParams

__all__ = ["GenerationResult", "LanguageModel", "SamplingParams", "load"]
