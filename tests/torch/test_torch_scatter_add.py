"""torch's adding scatters (index_add, scatter_add, index_put with accumulate) convert to IR scatter_add and
give torch's results, repeated indices included."""

from __future__ import annotations

import numpy as np
import torch

from edgerun.frontends.torch.export import export_graph
from edgerun.oracle import interpret


class Adds(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor, s: torch.Tensor, j: torch.Tensor,
                t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.index_add(1, i, s, alpha=2.0), x.scatter_add(0, j, t), x.index_add(0, i[:2], t[:2]),
                x.index_put((i - 4,), torch.ones(5), accumulate=True))


def test_adding_scatters_match_torch() -> None:
    torch.manual_seed(0)
    args = (torch.randn(4, 5), torch.tensor([0, 3, 0, 2]), torch.randn(4, 4), torch.randint(0, 4, (2, 5)),
            torch.randn(3, 5))
    graph = export_graph(Adds(), args)
    assert sum(n.op == "scatter_add" for n in graph.nodes) == 4
    got = interpret(graph, [a.numpy() for a in args])
    for ours, want in zip(got, Adds()(*args)):
        np.testing.assert_allclose(ours, want.numpy(), rtol=1e-6, atol=1e-6)
