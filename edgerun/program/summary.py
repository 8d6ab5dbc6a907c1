"""A short description of a program for `edgerun info`: ops, inputs, outputs, weights, metadata."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from edgerun.ir.graph import Graph


@dataclass(frozen=True)
class ProgramSummary:
    nodes: int
    op_counts: dict[str, int]  # sorted by op name
    inputs: dict[str, str]  # name -> spec, e.g. "float32[1,3,224,224]"
    outputs: dict[str, str]
    constants: int
    weight_bytes: int  # logical bytes; a file stores identical weights once, so it may be smaller
    weight_bytes_by_dtype: dict[str, int]
    metadata: dict[str, Any]
    format_version: tuple[int, int] | None  # of the file it was loaded from
    file_bytes: int | None
    # Multi-method programs and state (program_parts.py): every method's signature, each state's spec.
    methods: dict[str, str] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (for `edgerun info --json`)."""
        d = asdict(self)
        d["format_version"] = None if self.format_version is None else "{}.{}".format(*self.format_version)
        return d

    def __str__(self) -> str:
        lines = [f"{self.nodes} nodes, {self.constants} constants, {_human_bytes(self.weight_bytes)} of weights"]
        if self.format_version is not None:
            lines.append(f"program format {self.format_version[0]}.{self.format_version[1]}, "
                         f"file {_human_bytes(self.file_bytes or 0)}")
        if len(self.methods) > 1 or self.state:
            lines += [f"method {name}: {signature}" for name, signature in self.methods.items()]
            lines += [f"state  {name}: {spec}" for name, spec in self.state.items()]
        lines += [f"input  {name}: {spec}" for name, spec in self.inputs.items()]
        lines += [f"output {name}: {spec}" for name, spec in self.outputs.items()]
        lines += [f"  {count:6d}  {op}" for op, count in self.op_counts.items()]
        lines += [f"weights {dtype}: {_human_bytes(n)}" for dtype, n in self.weight_bytes_by_dtype.items()]
        lines += [f"{key}: {value}" for key, value in self.metadata.items()]
        return "\n".join(lines)


def method_signature(graph: Graph) -> str:
    """`x: float32[1,4], y: int64[] -> out: float32[1,4]`, the state a method reads and writes after it."""
    def values(names: list[str]) -> str:
        return ", ".join(f"{n}: {graph.specs[n]}" for n in names if n in graph.specs)

    text = f"({values(graph.inputs)}) -> ({values(graph.outputs)})"
    if graph.state_inputs or graph.state_updates:
        text += f"; reads state {sorted(graph.state_inputs)}, writes {sorted(graph.state_updates)}"
    return text


def summarize(graph: Graph, metadata: dict[str, Any], format_version: tuple[int, int] | None = None,
              file_bytes: int | None = None, methods: Mapping[str, Graph] | None = None,
              state: Mapping[str, str] | None = None) -> ProgramSummary:
    """The default method's ops, inputs and weights; `methods` (name -> graph) and `state` (name -> spec)
    for a program that has them."""
    by_dtype: dict[str, int] = {}
    for array in graph.constants.values():
        # A string constant counts its UTF-8 bytes (its array holds references), without the length prefixes.
        name, size = ("string", sum(len(s.encode()) for s in array.reshape(-1).tolist())) if array.dtype == object \
            else (array.dtype.name, int(array.nbytes))
        by_dtype[name] = by_dtype.get(name, 0) + size
    return ProgramSummary(
        nodes=len(graph.nodes),
        op_counts=graph.op_counts(),
        inputs={name: str(graph.specs[name]) for name in graph.inputs if name in graph.specs},
        outputs={name: str(graph.specs[name]) for name in graph.outputs if name in graph.specs},
        constants=len(graph.constants),
        weight_bytes=graph.weight_bytes(),
        weight_bytes_by_dtype=dict(sorted(by_dtype.items())),
        metadata=dict(metadata),
        format_version=format_version,
        file_bytes=file_bytes,
        methods={name: method_signature(g) for name, g in (methods or {}).items()},
        state=dict(state or {}),
    )


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
