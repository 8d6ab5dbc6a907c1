"""Realistic input sets for zoo programs: real sentences for MiniLM, prompts for the decoder.

Exporting needs torch (edgerun.frontends.torch); these helpers import it only when called, so the devtools
package itself still imports with numpy alone.
"""

from __future__ import annotations

import os

from edgerun.devtools.programs import InputSet, bind_input_set
from edgerun.ir.graph import Graph
from edgerun.program import Program

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I bake sourdough bread at home?",
    "Edge devices run compiled neural networks without Python.",
    "The committee postponed its decision until the next quarterly meeting, citing incomplete data.",
)


def export_zoo(name: str, path: str | os.PathLike[str]) -> Program:
    """The zoo model `name` exported to a program file at `path` (reused when it exists)."""
    if os.path.exists(path):
        return Program.read(path)
    from edgerun.frontends.torch import export
    from edgerun.zoo import get

    model = get(name)
    program = export(model.build(), model.example_inputs(), name=name)
    program.save(path)
    return program


def zoo_input_sets(name: str, graph: Graph, count: int = 2) -> list[InputSet]:
    """Realistic input sets for zoo model `name`: tokenised real sentences (MiniLM), Zipf-distributed
    prompts starting with a BOS id (the decoder), otherwise the zoo's own example inputs."""
    if name == "minilm_l6":
        from edgerun.zoo.minilm import tokenize

        return [bind_input_set([t.numpy() for t in tokenize([s])], graph, name) for s in SENTENCES[:count]]
    if name == "llama_small":
        from edgerun.zoo.inputs import token_ids
        from edgerun.zoo.llama import LlamaConfig

        cfg = LlamaConfig()
        return [bind_input_set([token_ids(cfg.seq, cfg.vocab, seed=5 + k).numpy()], graph, name)
                for k in range(count)]
    from edgerun.zoo import get

    return [bind_input_set([t.numpy() for t in get(name).example_inputs()], graph, name)]
