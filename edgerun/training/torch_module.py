"""A training program straight from a torch.nn.Module and its loss, weights named as torch names them."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.program import Program
from edgerun.training.build import TrainableSpec
from edgerun.training.optimizers import Optimizer
from edgerun.training.program import TrainingProgram, trainable


def _rename(graph: Graph, old: str, new: str) -> None:
    graph.constants[new] = graph.constants.pop(old)
    graph.specs[new] = graph.specs.pop(old)
    for node in graph.nodes:
        node.inputs = [new if i == old else i for i in node.inputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]


def export_for_training(module: Any, example_inputs: tuple[Any, ...], loss: str | Callable[..., Any] = "cross_entropy",
                        example_targets: Any = None) -> tuple[Program, str]:
    """The module (in eval mode: batch norm with its running statistics, no dropout) as a program whose
    weights are named after the module's parameters; with a loss function, the program's last output is
    `loss(module(*inputs), targets)` and the targets are its last input. Returns (program, loss name)."""
    import torch

    from edgerun.frontends.torch import export

    params = dict(module.named_parameters())
    saved = {name: p.detach().clone() for name, p in params.items()}
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():  # a distinct value in every parameter, so each weight is found by its data
            gen = torch.Generator().manual_seed(0)
            for p in params.values():
                p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) + 1.0)
            marked = {name: p.detach().cpu().numpy().copy() for name, p in params.items()}
        if callable(loss):
            if example_targets is None:
                raise EdgerunError("a loss function needs example_targets to export with")
            loss_fn = loss

            class WithLoss(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.model = module

                def forward(self, *args: Any) -> Any:
                    out = self.model(*args[:-1])
                    return out, loss_fn(out, args[-1])

            program = export(WithLoss(), (*example_inputs, example_targets), optimize=False)
            loss_name = program.graph.outputs[-1]
        else:
            program = export(module, tuple(example_inputs), optimize=False)
            loss_name = loss
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])
        module.train(was_training)
    graph = program.graph
    by_bytes = {(a.shape, a.dtype.str, a.tobytes()): name for name, a in graph.constants.items()}
    for name, arr in marked.items():
        key = (arr.shape, arr.dtype.str, arr.tobytes())
        if key in by_bytes and by_bytes[key] not in params:
            _rename(graph, by_bytes.pop(key), name)
            graph.constants[name] = saved[name].cpu().numpy().astype(arr.dtype)
    return program, loss_name


def from_torch(module: Any, example_inputs: Sequence[Any], loss: str | Callable[..., Any] = "cross_entropy",
               trainable_params: TrainableSpec = None, optimizer: Optimizer | None = None, *,
               example_targets: Any = None, clip_norm: float | None = None,
               backends: Sequence[str] | str | None = None, recompute: bool = True,
               activation_budget: int | None = None) -> TrainingProgram:
    """A training program of `module` at the shapes of `example_inputs`. `loss`: "cross_entropy", "mse",
    or a function (outputs, targets) -> scalar tensor, exported with the module (give `example_targets`).
    `trainable_params`: parameter names (module.named_parameters()) or a filter over them; default every
    parameter that requires a gradient and that the exported graph reads (the others are named in a warning).
    `recompute` and `activation_budget` as in `trainable`."""
    program, loss_name = export_for_training(module, tuple(example_inputs), loss, example_targets)
    if trainable_params is None:
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        missing = [n for n in names if n not in program.graph.constants]
        if missing:  # a parameter the outputs never read (a pooler beside the hidden states) has no gradient
            warnings.warn(f"parameters {missing[:5]}{' ...' if len(missing) > 5 else ''} are not in the exported "
                          "graph (unused by its outputs, or folded at export) and do not train", stacklevel=2)
        trainable_params = [n for n in names if n in program.graph.constants]
    return trainable(program, loss_name, trainable_params, optimizer, clip_norm=clip_norm, backends=backends,
                     recompute=recompute, activation_budget=activation_budget)
