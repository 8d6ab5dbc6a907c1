"""A short description of a program for `edgerun info`: ops, inputs, outputs, weights, metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass
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
        lines += [f"input  {name}: {spec}" for name, spec in self.inputs.items()]
        lines += [f"output {name}: {spec}" for name, spec in self.outputs.items()]
        lines += [f"  {count:6d}  {op}" for op, count in self.op_counts.items()]
        lines += [f"weights {dtype}: {_human_bytes(n)}" for dtype, n in self.weight_bytes_by_dtype.items()]
        lines += [f"{key}: {value}" for key, value in self.metadata.items()]
        return "\n".join(lines)


def summarize(graph: Graph, metadata: dict[str, Any], format_version: tuple[int, int] | None = None,
              file_bytes: int | None = None) -> ProgramSummary:
    by_dtype: dict[str, int] = {}
    for array in graph.constants.values():
        by_dtype[array.dtype.name] = by_dtype.get(array.dtype.name, 0) + int(array.nbytes)
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
    )


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
