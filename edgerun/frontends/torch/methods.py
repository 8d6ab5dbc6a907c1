"""Export several entry points of one module into one program: they share weights and state.

    program = edgerun.export_methods(model, {
        "prefill": ("prefill", (ids,)),           # a method of `model` by name ...
        "decode": (model.decode, (token, pos)),   # ... or a callable (bound method, closure over model)
    }, default_method="prefill")              # each entry may add kwargs and torch.export dynamic_shapes:
                                              # ("prefill", (ids,), None, {"ids": {1: Dim("seq", max=512)}})

Each method is captured by torch.export on its own (a wrapper module whose forward calls it, so the
module's parameters and buffers are the wrapper's), and converted. A buffer any method mutates is program
state in every method (a method that only reads it reads the state, not a constant snapshot); state names
are the buffers' FQNs in `model`. Constants are shared by name (Program.from_methods) and the writer stores
identical bytes once, so two methods over the same weights cost one copy of them in the file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edgerun.errors import EdgerunError
from edgerun.frontends.program_maker import optimize_keeping_state
from edgerun.frontends.torch.capture import capture
from edgerun.frontends.torch.convert import convert_exported_program
from edgerun.frontends.torch.state import StateCapture, mutated_buffers
from edgerun.frontends.torch.symbols import check_dynamic_shapes, per_input_specs, symbol_names
from edgerun.ir.graph import Graph
from edgerun.ir.verifier import verify
from edgerun.passes.pipeline import METADATA_KEY, records_to_json

if TYPE_CHECKING:
    from edgerun.program.program import Program

WRAPPED = "inner"  # the attribute the wrapper module holds the user's module under
# (method name or callable, args), optionally followed by kwargs and torch.export dynamic_shapes
MethodSpec = tuple[Any, ...]


def export_methods(module: Any, methods: Mapping[str, MethodSpec], *, default_method: str | None = None,
                   name: str | None = None, optimize: bool = True) -> Program:
    """One program with an entry point per item of `methods` (name -> (method, args[, kwargs])).

    `method` is the name of a method of `module` ("forward", "decode") or a callable. `default_method` (what
    calling the loaded program runs) defaults to "forward" when there is one, else the first method.
    """
    from edgerun.frontends.torch.export import torch_version
    from edgerun.program.program import Program, default_metadata

    if not methods:
        raise EdgerunError("export_methods needs at least one method")
    default = default_method or ("forward" if "forward" in methods else next(iter(methods)))
    if default not in methods:
        raise EdgerunError(f"default_method {default!r} is not among the methods {list(methods)}")
    programs, symbols = {}, {}
    for m, spec in methods.items():
        wrapper, args, kwargs, dynamic_shapes = _wrap(module, m, spec[0]), _args(m, spec), _kwargs(m, spec), \
            _dynamic_shapes(spec)
        if dynamic_shapes is not None:
            check_dynamic_shapes(dynamic_shapes)
            specs = per_input_specs(wrapper, args, kwargs, dynamic_shapes)
        programs[m] = capture(wrapper, args, kwargs, dynamic_shapes)
        if dynamic_shapes is not None:
            user_inputs = [n for n in programs[m].graph.nodes if n.op == "placeholder"
                           and n.name in set(programs[m].graph_signature.user_inputs)]
            symbols[m] = symbol_names(programs[m], user_inputs, specs)
    targets = list(dict.fromkeys(t for ep in programs.values() for t in mutated_buffers(ep)))
    names = {t: t.removeprefix(WRAPPED + ".") for t in targets}
    graphs: dict[str, Graph] = {}
    initial: dict[str, Any] = {}
    metadata = default_metadata()
    metadata.update(name=name or type(module).__name__, frontend=f"torch {torch_version()}")
    for method, ep in programs.items():
        state = StateCapture(dict(names))
        names_of, bounds = symbols.get(method, ({}, {}))
        graph = convert_exported_program(ep, names_of, bounds, state=state)
        verify(graph)
        initial.update(state.initial)
        if optimize:
            graph, records = optimize_keeping_state(graph)
            if method == default:
                metadata[METADATA_KEY] = records_to_json(records)
        graphs[method] = graph
    ordered = {default: graphs[default], **graphs}
    return Program.from_methods(ordered, default_method=default, state=initial, metadata=metadata)


def _wrap(module: Any, method: str, target: Any) -> Any:
    import torch

    fn: Callable[..., Any]
    if isinstance(target, str):
        fn = getattr(module, target, None)  # type: ignore[assignment]
        if not callable(fn):
            raise EdgerunError(f"method {method!r}: {type(module).__name__} has no method {target!r}")
    elif callable(target):
        fn = target
    else:
        raise EdgerunError(f"method {method!r}: expected a method name or a callable, got {type(target).__name__}")

    class MethodModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, WRAPPED, module)  # registers the module: its weights and buffers are ours

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    # forward shows the method's signature, so dynamic_shapes may name the method's arguments
    signature = inspect.signature(fn)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    MethodModule.forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()])
    return MethodModule()


def _args(method: str, spec: MethodSpec) -> tuple[Any, ...]:
    if not isinstance(spec, tuple) or len(spec) not in (2, 3, 4):
        raise EdgerunError(f"method {method!r}: expected (method, args), (method, args, kwargs) or (method, "
                           f"args, kwargs, dynamic_shapes), got {spec!r}")
    args = spec[1]
    return args if isinstance(args, tuple) else (args,)


def _dynamic_shapes(spec: MethodSpec) -> Any:
    return spec[3] if len(spec) == 4 else None


def _kwargs(method: str, spec: MethodSpec) -> dict[str, Any] | None:
    kwargs = spec[2] if len(spec) >= 3 else None
    if kwargs is not None and not isinstance(kwargs, dict):
        raise EdgerunError(f"method {method!r}: kwargs must be a dict, got {type(kwargs).__name__}")
    return kwargs
