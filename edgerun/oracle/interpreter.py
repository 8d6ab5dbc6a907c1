"""The one node walk over the reference kernels: no memory planning, every value kept.

The runtime's planned executor is the fast path; this is the oracle's simplest form. `interpret` (tests,
the frontends' import-time folding, the developer tools), constant folding (`run_node`), and the
reference and faulty backends' standalone partitions (`run_partition`) all walk graphs through `walk`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.ir.decompose import decomposed
from edgerun.ir.dtypes import DType, string_array
from edgerun.ir.graph import Graph, Node
from edgerun.ir.specialize import bind_symbols, specialize
from edgerun.ir.staging import has_data_dependent, split_at_data_dependent
from edgerun.ir.subgraphs import is_control_flow
from edgerun.oracle.control_flow import run_control_flow
from edgerun.oracle.data_dependent_kernels import DATA_DEPENDENT_KERNELS
from edgerun.oracle.kernels import KERNELS, Kernel

NodeHook = Callable[[Node, list[np.ndarray], list[np.ndarray]], None]
# Picks the kernel for a node (a test backend swaps one in); None means the reference kernel.
KernelChoice = Callable[[Node], Kernel | None]


def bind_inputs(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check user inputs against the graph's input specs; EdgerunError naming the first that does not fit."""
    if isinstance(inputs, Mapping):
        missing = [n for n in graph.inputs if n not in inputs]
        if missing:
            raise EdgerunError(f"missing inputs {missing}; the program takes {graph.inputs}")
        values = [inputs[n] for n in graph.inputs]
    else:
        values = list(inputs)
        if len(values) != len(graph.inputs):
            raise EdgerunError(f"the program takes {len(graph.inputs)} inputs {graph.inputs}, got {len(values)}")
    bound = {}
    for name, value in zip(graph.inputs, values):
        spec = graph.specs[name]
        arr = np.asarray(value)
        if tuple(arr.shape) != spec.shape:
            raise EdgerunError(f"input {name!r} must have shape {spec.shape}, got {tuple(arr.shape)}")
        if spec.dtype is DType.string:
            arr = string_array(arr, f"input {name!r}")
        elif arr.dtype != spec.dtype.np:
            arr = _converted_input(arr, spec.dtype, name)
        bound[name] = arr
    return bound


def _converted_input(arr: np.ndarray, dtype: DType, name: str) -> np.ndarray:
    """`arr` as the input's dtype when that keeps its values: a cast within a kind (int64 ids into int32,
    float64 into float32, which rounds as every float32 program does), never one that would wrap an integer
    or overflow a float to infinity (the program would then run on values the caller never passed)."""
    target = dtype.np
    if not np.can_cast(arr.dtype, target, casting="same_kind"):
        raise EdgerunError(f"input {name!r} must be {dtype.value}, got {arr.dtype}")
    if arr.size and not np.can_cast(arr.dtype, target, casting="safe"):
        if np.issubdtype(target, np.integer) and arr.dtype != np.bool_:
            info = np.iinfo(target)
            low, high = arr.min(), arr.max()
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                raise EdgerunError(f"input {name!r} holds {bad}, outside {dtype.value}'s range "
                                   f"[{info.min}, {info.max}]")
        elif np.issubdtype(target, np.floating):
            finite = arr[np.isfinite(arr)]
            limit = np.finfo(target).max
            if finite.size and np.abs(finite).max() > limit:
                raise EdgerunError(f"input {name!r} holds {finite[np.abs(finite).argmax()]}, beyond {dtype.value}'s "
                                   f"largest value {limit}: it would become infinity")
    return arr.astype(target)


def run_node(node: Node, args: list[np.ndarray], graph: Graph, kernel: Kernel | None = None) -> list[np.ndarray]:
    """Fresh output arrays of `node` computed from `args` (by `kernel`, default the reference one)."""
    if kernel is None:
        if node.op in DATA_DEPENDENT_KERNELS:  # its outputs' extent is what it computes: it allocates them
            return DATA_DEPENDENT_KERNELS[node.op](args, node.attrs)
        kernel = KERNELS.get(node.op)
        if kernel is None and is_control_flow(node.op):
            return run_control_flow(node, args, graph, run_body)
        if kernel is None:
            raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                     detail="no reference kernel (composite ops must be decomposed first)")
    outs = [np.empty(graph.specs[o].shape, graph.specs[o].dtype.np) for o in node.outputs]
    kernel(args, node.attrs, outs)
    return outs


def walk(graph: Graph, env: dict[str, np.ndarray], *, kernel_for: KernelChoice | None = None,
         hook: NodeHook | None = None) -> dict[str, np.ndarray]:
    """Run every node of `graph` in order, adding its outputs to `env` (which must hold inputs and constants)."""
    for node in graph.nodes:
        args = [env[i] for i in node.inputs if i]
        outs = run_node(node, args, graph, kernel_for(node) if kernel_for is not None else None)
        if hook is not None:
            hook(node, args, outs)
        env.update(zip(node.outputs, outs))
    return env


def run_body(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a control-flow body (a closed graph) on its inputs: the oracle's BodyRunner."""
    body = decomposed(body)  # the same graph, unless it still holds composites (rare: callers lower first)
    env: dict[str, np.ndarray] = dict(body.constants)
    env.update(zip(body.inputs, args))
    walk(body, env)
    return [env[o] for o in body.outputs]


def run_partition(graph: Graph, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                  kernel_for: KernelChoice | None = None) -> None:
    """A compiled partition's standalone `run`: reads `inputs`, writes `outputs` in place."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(zip(graph.inputs, inputs))
    with np.errstate(all="ignore"):
        walk(graph, env, kernel_for=kernel_for)
    for name, dst in zip(graph.outputs, outputs):
        np.copyto(dst, env[name])


def interpret(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
              hook: NodeHook | None = None, decompose: bool = True) -> list[np.ndarray]:
    """Run `graph` on numpy inputs and return its outputs. Composite ops are decomposed first (on a copy).

    A graph with a data-dependent op (nonzero, unique, ...) runs in stages (run_in_stages)."""
    if has_data_dependent(graph):
        return run_in_stages(graph, bind_inputs_by_rank(graph, inputs), hook)
    if decompose:
        graph = decomposed(graph)
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(bind_inputs(graph, inputs))
    walk(graph, env, hook=hook)
    return [np.array(env[o]) for o in graph.outputs]


def bind_inputs_by_rank(graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs by name, checked for count, rank and dtype only (a template's sizes are checked when bound)."""
    values = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(graph.inputs, inputs))
    if sorted(values) != sorted(graph.inputs):
        raise EdgerunError(f"the program takes inputs {graph.inputs}, got {sorted(values)}")
    bound = {}
    for name in graph.inputs:
        spec, arr = graph.specs[name], np.asarray(values[name])
        if spec.dtype is DType.string:
            arr = string_array(arr, f"input {name!r}")
        if arr.ndim != spec.rank or arr.dtype != spec.dtype.np:
            raise EdgerunError(f"input {name!r} must be {spec}, got {arr.dtype}{list(arr.shape)}")
        bound[name] = arr
    return bound


def run_in_stages(graph: Graph, inputs: Mapping[str, np.ndarray], hook: NodeHook | None = None) -> list[np.ndarray]:
    """Run a graph split at its data-dependent nodes (ir/staging.py): each stage a template specialised to
    the shapes it sees, the data-dependent node on its reference kernel, whose outputs bind its extent."""
    if not has_data_dependent(graph):
        if graph.symbols:
            graph = specialize(graph, bind_symbols(graph, {n: inputs[n].shape for n in graph.inputs}))
        return interpret(graph, {n: inputs[n] for n in graph.inputs}, hook)
    stages = split_at_data_dependent(graph)
    env = dict(inputs)
    if stages.prefix.outputs:
        env.update(zip(stages.prefix.outputs, run_in_stages(stages.prefix, inputs, hook)))
    env.update(graph.constants)
    node = stages.node
    args = [env[i] for i in node.inputs if i]
    outs = DATA_DEPENDENT_KERNELS[node.op](args, node.attrs)
    if hook is not None:
        hook(node, args, outs)
    env.update(zip(node.outputs, outs))
    return run_in_stages(stages.suffix, {n: env[n] for n in stages.suffix.inputs}, hook)
