"""A training program from an inference program: weights become state, and three methods share them.

    forward(*inputs)                          -> the model's outputs with the current weights
    train_step(*inputs, targets, learning_rate) -> (mean loss, whether the step was applied)
    evaluate(*inputs, targets)                -> mean loss
    gradients(*inputs, targets)               -> (mean loss, the gradient of each trained weight)

The trained weights and the optimizer's moments and step count are program state (ir/state.py), so the
runtime reads them as views and writes their updates in place, and each method has one arena plan. The
train_step graph is the forward graph, the loss, the backward graph (passes/autodiff.py) and the optimizer's
arithmetic, all ordinary IR. A step whose loss or gradients are not finite leaves every state as it was
(each update is a `where` on one flag) and says so in its second output.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.state import on_functional
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.passes.autodiff import activations_kept, append_gradients, recompute_cheap, recompute_to_budget
from edgerun.passes.conv_over_windows import convolve_over_windows
from edgerun.passes.pipeline import optimize
from edgerun.passes.raster_merge_pass import RasterMergePass
from edgerun.passes.transposed_matmul import swap_transposed_products
from edgerun.program import Program
from edgerun.training.losses import LOSSES, emit_loss, target_spec
from edgerun.training.optimizers import Optimizer, optimizer_to_json

STEP_STATE = "optimizer.step"
LEARNING_RATE = "learning_rate"
TrainableSpec = Iterable[str] | Callable[[str], bool] | None


@dataclass(frozen=True)
class TrainingLayout:
    """What the methods take: the model's inputs, then the targets (built-in losses), then the rate."""

    inputs: tuple[str, ...]  # forward's inputs
    loss_inputs: tuple[str, ...]  # evaluate's inputs (train_step's are these and the learning rate)
    trainable: tuple[str, ...]
    slots: tuple[str, ...]  # optimizer state per weight: "<weight>.<slot>"


def choose_trainable(graph: Graph, trainable: TrainableSpec) -> list[str]:
    """The weights to train: names, a filter over weight names, or None for every float weight of rank >= 1."""
    weights = [n for n, a in graph.constants.items() if graph.specs[n].dtype.is_float]
    if trainable is None:
        chosen = [n for n in weights if graph.specs[n].rank >= 1]
    elif callable(trainable):
        chosen = [n for n in weights if trainable(n)]
    else:
        chosen = []
        for name in trainable:
            if name in graph.inputs:
                raise EdgerunError(f"{name!r} is an input of the program ({graph.specs[name]}), not a weight: only "
                                   "float weights train")
            if name in graph.constants and name not in weights:
                raise EdgerunError(f"weight {name!r} is {graph.specs[name]}: only float weights train")
            if name not in graph.constants:
                known = ", ".join(sorted(weights)[:12]) + (" ..." if len(weights) > 12 else "")
                raise EdgerunError(f"unknown trainable {name!r}: the program's float weights are {known}")
            if name not in chosen:
                chosen.append(name)
    if not chosen:
        raise EdgerunError("nothing to train: no float weight was chosen")
    return chosen


def _optimized(graph: Graph) -> Graph:
    """The default pipeline, verifying the result once rather than after every pass (the backward graph is
    large: per-pass verification was a third of building a MobileNetV2's training program); then each
    weight gradient that comes out transposed is computed in the weight's layout (passes/transposed_matmul.py)."""
    def run(functional: Graph) -> Graph:
        functional = optimize(functional, verify_each=False)[0]
        if swap_transposed_products(functional):
            functional = RasterMergePass().call(functional).graph
        return functional

    optimized = on_functional(graph, run)
    verify(optimized)
    return optimized


def _without_unused_inputs(graph: Graph) -> Graph:
    """`graph` without the nodes its outputs and state updates do not need, and without the inputs only
    those read (a loss's targets, when forward leaves the loss out)."""
    live = set(graph.outputs) | set(graph.state_updates.values())
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(i for i in node.inputs if i)
    graph.nodes = kept[::-1]
    read = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    graph.inputs = [i for i in graph.inputs if i in read]
    graph.prune_specs()
    return graph


def as_float32(b: Builder, value: str) -> str:
    return value if b.dtype(value) is DType.float32 else b.emit("cast", [value], dtype="float32")


def _backward_nodes(graph: Graph, gradients: dict[str, str]) -> int:
    """How many of the graph's last nodes append_gradients added (they carry meta "gradient_of", or follow
    the first that does)."""
    for index, node in enumerate(graph.nodes):
        if "gradient_of" in node.meta:
            return len(graph.nodes) - index
    return 0


def build_training_program(program: Program, loss: str, trainable: TrainableSpec, optimizer: Optimizer,
                           clip_norm: float | None = None, recompute: bool = True,
                           activation_budget: int | None = None) -> tuple[Program, TrainingLayout]:
    """The training program of `program`'s default method (see the module docstring); `recompute`: compute
    cheap elementwise activations again in backward instead of keeping them (autodiff.recompute_cheap);
    `activation_budget`: bytes of forward activations backward may keep, more of them recomputed to fit
    (autodiff.recompute_to_budget)."""
    source = program.graph
    if source.symbols:
        raise EdgerunError("training needs a program at fixed shapes: export it at the batch size it trains with")
    if clip_norm is not None and not clip_norm > 0:
        raise EdgerunError(f"clip_norm must be positive, got {clip_norm}")
    if activation_budget is not None and (not recompute or isinstance(activation_budget, bool)
                                          or not isinstance(activation_budget, int) or activation_budget < 0):
        raise EdgerunError(f"activation_budget must be a number of bytes >= 0, with recompute on; got "
                           f"{activation_budget!r} (recompute={recompute})")
    graph = source.copy()
    chosen = choose_trainable(graph, trainable)
    state = dict(program.state)
    for name in chosen:
        state[name] = np.array(graph.constants.pop(name), copy=True)
        graph.state_inputs.append(name)

    b = Builder(graph)
    if loss in LOSSES:
        if not graph.outputs:
            raise EdgerunError("the program has no outputs to take a loss of")
        spec = target_spec(loss, graph.specs[graph.outputs[0]])
        targets = graph.add_input("targets" if "targets" not in graph.specs else graph.fresh_name("targets"), spec)
        forward = graph.copy()
        forward.inputs.remove(targets)
        forward.prune_specs()
        loss_value = emit_loss(b, loss, graph.outputs[0], targets)
    else:
        if loss not in graph.outputs:
            raise EdgerunError(f"unknown loss {loss!r}: use one of {list(LOSSES)} or the name of a scalar output "
                               f"(the outputs are {graph.outputs})")
        spec = graph.specs[loss]
        if not spec.dtype.is_float or spec.numel != 1:
            raise EdgerunError(f"the loss must be a float scalar; output {loss!r} is {spec}")
        forward = graph.copy()
        forward.outputs = [o for o in forward.outputs if o != loss]
        if not forward.outputs:
            raise EdgerunError(f"the program's only output is the loss {loss!r}: forward would have nothing to give")
        _without_unused_inputs(forward)
        loss_value = loss
    graph.outputs = [loss_value]
    evaluate = graph.copy()
    gradients = graph.copy()
    found = append_gradients(gradients, loss_value, chosen)
    convolve_over_windows(gradients)  # before what is kept is chosen: the windows become a kept activation
    forward_nodes = len(gradients.nodes) - _backward_nodes(gradients, found)
    gradients.outputs = [loss_value, *(found[w] for w in chosen)]
    kept_all, produced = activations_kept(gradients, forward_nodes)
    if activation_budget is not None:
        _, fitted = recompute_to_budget(gradients, forward_nodes, activation_budget)
        if fitted > activation_budget:
            warnings.warn(f"activation_budget {activation_budget:,} B is below what backward must keep: recomputing "
                          f"every activation that frees memory still keeps {fitted:,} B", RuntimeWarning, stacklevel=3)
    elif recompute:
        recompute_cheap(gradients, forward_nodes)

    train = graph
    tb = Builder(train)
    lr = train.add_input(LEARNING_RATE, TensorSpec((), DType.float32))
    step = STEP_STATE
    train.specs[step] = TensorSpec((), DType.float32)
    train.state_inputs.append(step)
    state[step] = np.zeros((), np.float32)
    slots: dict[str, dict[str, str]] = {}
    for w in chosen:
        slots[w] = {}
        for slot in optimizer.slots():
            name = f"{w}.{slot}"
            train.specs[name] = train.specs[w]
            train.state_inputs.append(name)
            state[name] = np.zeros(state[w].shape, state[w].dtype)
            slots[w][slot] = name
    grads = append_gradients(train, loss_value, chosen)
    convolve_over_windows(train)
    if activation_budget is not None:
        recompute_to_budget(train, len(train.nodes) - _backward_nodes(train, grads), activation_budget)
    elif recompute:
        recompute_cheap(train, len(train.nodes) - _backward_nodes(train, grads))
    loss32 = loss_value if train.specs[loss_value].dtype is DType.float32 else tb.emit("cast", [loss_value], dtype="float32")
    loss32 = tb.emit("reshape", [loss32], shape=[]) if train.specs[loss32].shape != () else loss32
    # Whether the step applies: the loss and every gradient finite. A sum is not finite when any term is not
    # (inf - inf is NaN), and x - x is 0 exactly when x is finite: one read of each gradient, where a sum of
    # squares (needed only to clip) reads it, writes the squares and reads them again.
    if clip_norm is None:
        sums = [as_float32(tb, tb.emit("reduce_sum", [grads[w]])) for w in chosen]
        total = loss32
        for s in sums:
            total = tb.binary("add", total, s)
        finite = tb.binary("eq", tb.binary("sub", total, total), tb.const(np.float32(0.0)))
    else:
        squares = [as_float32(tb, tb.emit("reduce_sum", [tb.binary("mul", grads[w], grads[w])])) for w in chosen]
        total = squares[0]
        for s in squares[1:]:
            total = tb.binary("add", total, s)
        finite = tb.binary("lt", tb.binary("add", total, tb.binary("mul", loss32, loss32)),
                           tb.const(np.float32(np.inf)))
        # torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), at most 1
        coef = tb.binary("minimum", tb.binary("div", tb.const(np.float32(clip_norm)),
                                              tb.binary("add", tb.unary("sqrt", total), tb.const(np.float32(1e-6)))),
                         tb.const(np.float32(1.0)))
        for w in chosen:
            c = coef if train.specs[w].dtype is DType.float32 else tb.emit("cast", [coef], dtype=train.specs[w].dtype.value)
            grads[w] = tb.binary("mul", grads[w], c)
    next_step = tb.binary("add", step, tb.const(np.float32(1.0)))
    for w in chosen:
        dtype = train.specs[w].dtype
        rate = lr if dtype is DType.float32 else tb.emit("cast", [lr], dtype=dtype.value)
        at = next_step if dtype is DType.float32 else tb.emit("cast", [next_step], dtype=dtype.value)
        new_w, new_slots = optimizer.emit(tb, w, grads[w], slots[w], rate, at, finite)
        train.state_updates[w] = new_w  # the old value itself when the step does not apply (optimizers.py)
        for slot, value in new_slots.items():
            train.state_updates[slots[w][slot]] = value
    train.state_updates[step] = tb.emit("where", [finite, next_step, step])
    train.outputs = [loss_value, finite]

    methods = {"forward": _optimized(forward), "train_step": _optimized(train), "evaluate": _optimized(evaluate),
               "gradients": _optimized(gradients)}
    metadata = dict(program.metadata)
    metadata.pop("passes", None)
    kept, _ = activations_kept(gradients, forward_nodes)
    metadata["training"] = {"loss": loss, "trainable": list(chosen), "optimizer": optimizer_to_json(optimizer),
                            "activation_bytes": {"kept_for_backward": kept, "forward": produced,
                                                 "kept_without_recompute": kept_all,
                                                 "budget": activation_budget}}
    built = Program.from_methods(methods, default_method="forward", state=state, metadata=metadata)
    layout = TrainingLayout(tuple(forward.inputs), tuple(evaluate.inputs), tuple(chosen), tuple(optimizer.slots()))
    return built, layout
