"""ConvertContext: the state of one FX-graph-to-IR conversion, and the helpers every ATen handler uses.

Handlers see FX nodes; the context maps them to IR value names, binds ATen arguments by schema name, and
applies torch's type promotion (our binary ops need inputs of one dtype, so casts are made explicit here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.torch.source_info import module_path, source_line
from edgerun.frontends.torch.symbols import to_dim
from edgerun.frontends.torch.torch_dtypes import to_dtype, to_torch
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import Dim, is_symbolic

# What a handler returns: one value, several (multi-output ATen ops), or None for ops with no result.
HandlerResult = str | Sequence[str | None] | None
Handler = Callable[["ConvertContext", Any], HandlerResult]

HANDLERS: dict[str, Handler] = {}


def handles(*overloads: str) -> Callable[[Handler], Handler]:
    """Register a handler for ATen overloads named as str(OpOverload), e.g. "aten.add.Tensor"."""
    def deco(fn: Handler) -> Handler:
        for name in overloads:
            if name in HANDLERS:
                raise ValueError(f"two handlers for {name}")
            HANDLERS[name] = fn
        return fn
    return deco


class ConvertContext:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.b = Builder(graph)
        self.env: dict[Any, Any] = {}  # fx.Node -> value name, list of names, or None
        self.node: Any = None  # the FX node being converted
        self.user_outputs: set[str] = set()  # names of FX nodes the model returns (not mutation write-backs)
        self.symbol_names: dict[str, str] = {}  # torch size symbol (s0, s27) -> the user's Dim name

    def dims(self, shape: Any) -> tuple[Dim, ...]:
        """A torch shape (ints and SymInts) as edgerun dimensions (ints and SymDims)."""
        return tuple(to_dim(d, self.symbol_names) for d in shape)

    # -- errors --------------------------------------------------------------------------------------------
    def unsupported(self, detail: str) -> NoReturn:
        node = self.node
        raise UnsupportedOpError(str(node.target), module_path=module_path(node) or None,
                                 source=source_line(node) or None, detail=detail)

    # -- arguments -----------------------------------------------------------------------------------------
    def bind(self, node: Any) -> dict[str, Any]:
        """The node's arguments by schema name, defaults filled in."""
        schema = node.target._schema
        out: dict[str, Any] = {}
        for i, arg in enumerate(schema.arguments):
            if i < len(node.args) and not arg.kwarg_only:
                out[arg.name] = node.args[i]
            elif arg.name in node.kwargs:
                out[arg.name] = node.kwargs[arg.name]
            elif arg.has_default_value():
                out[arg.name] = arg.default_value
            else:
                out[arg.name] = None
        return out

    def v(self, arg: Any) -> str:
        """The IR value of a tensor argument (an FX node)."""
        import torch.fx

        if not isinstance(arg, torch.fx.Node):
            self.unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        value = self.env[arg]
        if value is None and type(self.fake(arg)).__name__ in ("SymFloat", "SymBool"):
            self.unsupported(f"argument {arg.name} is a float or boolean computed from symbolic sizes "
                             f"({self.fake(arg)}); template programs compute with sizes as integers only")
        if not isinstance(value, str):
            self.unsupported(f"argument {arg.name} is not a single tensor")
        return value

    def size(self, arg: Any) -> Dim:
        """An int argument that may be a size computed in the graph (a SymInt node): an int or a SymDim."""
        if self.is_tensor(arg):
            value = self.env[arg]
            if isinstance(value, str) or value is None:
                self.unsupported(f"argument {arg.name} is a tensor where a size is expected")
            return value  # type: ignore[no-any-return]
        return to_dim(arg, self.symbol_names)

    @staticmethod
    def is_tensor(arg: Any) -> bool:
        import torch.fx

        return isinstance(arg, torch.fx.Node)

    # -- types ---------------------------------------------------------------------------------------------
    def fake(self, arg: Any) -> Any:
        return arg.meta.get("val")

    def dtype_of_torch(self, torch_dtype: Any) -> DType:
        dtype = to_dtype(torch_dtype)
        if dtype is None:
            self.unsupported(f"dtype {torch_dtype} has no edgerun equivalent")
        return dtype

    def out_dtype(self, node: Any, index: int | None = None) -> DType:
        val = self.fake(node)
        if index is not None:
            val = val[index]
        return self.dtype_of_torch(val.dtype)

    def out_shape(self, node: Any, index: int | None = None) -> tuple[int, ...]:
        val = self.fake(node)
        if index is not None:
            val = val[index]
        return self.dims(val.shape)

    def result_type(self, *args: Any) -> DType:
        """torch's promoted dtype of tensors (FX nodes) and Python scalars, as torch.result_type would give."""
        import torch
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        stand_ins = [1 if self.is_tensor(a) and isinstance(self.fake(a), torch.SymInt)
                     else torch.empty((1,) * self.fake(a).dim(), dtype=self.fake(a).dtype) if self.is_tensor(a) else a
                     for a in args if a is not None]
        _, result = elementwise_dtypes(*stand_ins, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        return self.dtype_of_torch(result)

    # -- values --------------------------------------------------------------------------------------------
    def cast(self, value: str, dtype: DType) -> str:
        return value if self.b.dtype(value) is dtype else self.b.emit("cast", [value], dtype=dtype.value)

    def operand(self, arg: Any, dtype: DType) -> str:
        """A tensor argument cast to `dtype`, or a Python scalar as a 0-d constant of `dtype`."""
        if self.is_tensor(arg) and not isinstance(self.env.get(arg), str) and self.env.get(arg) is not None:
            return self.dim_scalar(self.size(arg), dtype)  # a size computed in the graph (a SymInt node)
        if self.is_tensor(arg):
            return self.cast(self.v(arg), dtype)
        if isinstance(arg, bool | int | float):
            if not np.isfinite(arg) and not dtype.is_float:
                self.unsupported(f"scalar {arg} in an integer computation")
            return self.b.const(np.asarray(arg), dtype)
        self.unsupported(f"unsupported scalar argument {arg!r}")

    def dim_scalar(self, value: Dim, dtype: DType) -> str:
        """A size as a 0-d value of `dtype`: a constant, or dim_value when it is symbolic."""
        if is_symbolic(value):
            return self.b.emit("dim_value", [], value=value, dtype=dtype.value)
        return self.b.const(np.asarray(value), dtype)

    def const_like_torch(self, data: Any) -> str:
        """A constant from a real torch tensor (parameters, buffers, lifted constants)."""
        dtype = self.dtype_of_torch(data.dtype)
        arr = data.detach().cpu().contiguous().numpy().astype(dtype.np, copy=True)
        return self.graph.add_constant(arr, hint="w")

    def torch_dtype(self, dtype: DType) -> Any:
        return to_torch(dtype)


def reads_beyond(ctx: ConvertContext, node: Any, keep: int) -> bool:
    """Whether the graph reads any output of a multi-output node at index >= keep."""
    import operator

    return any(u.target is not operator.getitem or (int(u.args[1]) >= keep and
                                                    any(r.op != "output" or u.name in ctx.user_outputs
                                                        for r in u.users))
               for u in node.users)


def reject_extra_outputs(ctx: ConvertContext, node: Any, keep: int) -> None:
    """Reject multi-output ops whose extra outputs (saved statistics, indices) the graph actually reads."""
    import operator

    for user in node.users:
        if user.target is not operator.getitem:
            ctx.unsupported("reading its outputs as a tuple")
        # A read by the output node alone is a mutation write-back (e.g. running stats), not a user output.
        readers = [u for u in user.users if u.op != "output" or user.name in ctx.user_outputs]
        if int(user.args[1]) >= keep and readers:
            ctx.unsupported("reading its secondary outputs (statistics or indices)")
