"""The default pass pipeline, and the per-pass op-count records that program metadata carries.

Order (measured on the zoo, see docs/passes.md): decompose first (all but PROGRAM_COMPOSITES, which stay
whole until a backend claims them at load), since every later pass works on atomic ops and rasters; constant folding before the conv fold, so batch-norm statistics are already two vectors (the
other way round folds no batch norm at all); common subexpressions next, so raster merging sees one copy of
each; dead code last, to drop what the others orphaned. Running the whole list a second time removes
nothing more on the zoo, so there is no outer loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgerun.ir.decompose import restore_output_names
from edgerun.ir.graph import Graph
from edgerun.passes.base import Pass, PassRecord, run_pipeline
from edgerun.passes.common_subexpression_pass import CommonSubexpressionPass
from edgerun.passes.constant_fold_pass import ConstantFoldPass
from edgerun.passes.conv_affine_fold_pass import ConvAffineFoldPass
from edgerun.passes.dead_code_pass import DeadCodePass
from edgerun.passes.decompose_pass import PROGRAM_COMPOSITES, DecomposePass
from edgerun.passes.raster_merge_pass import RasterMergePass

# The program metadata key under which `optimize`'s records are stored (see records_to_json).
METADATA_KEY = "passes"


def default_pipeline() -> list[Pass]:
    """The passes export runs, in order."""
    return [DecomposePass(keep=PROGRAM_COMPOSITES), ConstantFoldPass(), ConvAffineFoldPass(), CommonSubexpressionPass(),
            RasterMergePass(), DeadCodePass()]


def template_pipeline() -> list[Pass]:
    """The passes a template (a graph with symbolic dimensions) gets at export: only those safe on symbols.

    Decomposition would turn layout composites into rasters, whose regions are concrete integers, and the
    folds and raster merging work on those; all of them run per concrete shape when the runtime
    specialises the template (runtime/specializing.py), through `optimize` with the default pipeline.
    """
    return [DeadCodePass()]


def optimize(graph: Graph, passes: Sequence[Pass] | None = None,
             verify_each: bool = True) -> tuple[Graph, list[PassRecord]]:
    """Run the pipeline (default: `default_pipeline()`) on a copy of `graph`; the records hold op counts.

    Graph outputs keep their names (decomposition renames values), so callers can still find them by name.
    """
    optimized, records = run_pipeline(graph.copy(), list(passes) if passes is not None else default_pipeline(),
                                      verify_each=verify_each)
    restore_output_names(optimized, graph.outputs)
    return optimized, records


def records_to_json(records: Sequence[PassRecord]) -> list[dict[str, Any]]:
    """JSON-ready form of pass records, for program metadata."""
    return [{"name": r.name, "ops_before": dict(r.ops_before), "ops_after": dict(r.ops_after),
             "seconds": round(float(r.seconds), 6)} for r in records]


def records_from_json(data: Any) -> list[PassRecord]:
    """Inverse of records_to_json; ValueError when `data` is not in that form."""
    if not isinstance(data, list):
        raise ValueError(f"pass records must be a list, got {type(data).__name__}")
    records = []
    for item in data:
        if not isinstance(item, dict) or not {"name", "ops_before", "ops_after"} <= item.keys():
            raise ValueError(f"pass record needs name, ops_before and ops_after: {item!r}")
        counts = []
        for key in ("ops_before", "ops_after"):
            value = item[key]
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int)
                                                      for k, v in value.items()):
                raise ValueError(f"pass record {key} must map op names to counts: {value!r}")
            counts.append(dict(value))
        records.append(PassRecord(str(item["name"]), counts[0], counts[1], float(item.get("seconds", 0.0))))
    return records


def format_pass_table(records: Sequence[PassRecord]) -> str:
    """A text table: per pass, the node count before and after, the change per op, and the time taken."""
    rows = [("pass", "ops before", "ops after", "changes", "ms")]
    for r in records:
        ops = sorted(set(r.ops_before) | set(r.ops_after))
        deltas = [(op, r.ops_after.get(op, 0) - r.ops_before.get(op, 0)) for op in ops]
        changes = " ".join(f"{op}{d:+d}" for op, d in deltas if d) or "-"
        rows.append((r.name, str(sum(r.ops_before.values())), str(sum(r.ops_after.values())), changes,
                     f"{r.seconds * 1000:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        lines.append(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  "
                     f"{row[3]:<{widths[3]}}  {row[4]:>6}".rstrip())
    return "\n".join(lines)
