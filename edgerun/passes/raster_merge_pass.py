"""RasterMergePass: fuse chains of rasters into one (vertical), dedupe identical rasters (horizontal), drop identities.

Vertical merging composes index maps (see raster_regions.py): a raster that reads another raster's output
reads that raster's sources directly when the composed map fits in no more regions than the two rasters had
together and the fill values agree. The reading raster keeps its output name, so graph outputs and
downstream nodes are untouched; the inner raster dies when nothing else reads it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import Region
from edgerun.passes.base import Pass, PassResult
from edgerun.passes.common_subexpression_pass import merge_identical_nodes
from edgerun.passes.dead_code_pass import remove_dead_nodes
from edgerun.passes.raster_regions import MAX_MAP_ELEMENTS, fit_regions, raster_index_map

_MAX_ROUNDS = 8
_RASTER = frozenset({"raster"})  # horizontal merging: identical rasters become one


class RasterMergePass(Pass):
    """Merge raster chains into single rasters, dedupe identical rasters and remove identity rasters."""

    name = "raster_merge"

    def call(self, graph: Graph) -> PassResult:
        changed = False
        for _ in range(_MAX_ROUNDS):
            round_changed = merge_vertical(graph)
            round_changed |= remove_identity_rasters(graph)
            round_changed |= merge_identical_nodes(graph, _RASTER)
            round_changed |= remove_dead_nodes(graph)
            if not round_changed:
                break
            changed = True
        graph.prune_specs()
        return PassResult(graph, changed)


# ---- vertical ----------------------------------------------------------------------------------------

def _numel(graph: Graph, value: str) -> int:
    return math.prod(graph.specs[value].shape)


def _same_fill(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray([a], dtype=np.float64), np.asarray([b], dtype=np.float64),
                               equal_nan=True)) if not isinstance(a, bool) else a == b


def _compose(graph: Graph, outer: Node, inner: dict[int, Node]) -> tuple[list[str], dict[str, Any]] | None:
    """New (sources, attrs) for `outer` reading through the rasters in `inner` (by source slot), or None."""
    out = outer.outputs[0]
    osid, oidx = raster_index_map(outer.attrs["regions"], _numel(graph, out))
    sources: list[str] = []
    slot_of: dict[str, int] = {}

    def slot(value: str) -> int:
        if value not in slot_of:
            slot_of[value] = len(sources)
            sources.append(value)
        return slot_of[value]

    sid = np.full_like(osid, -1)
    idx = np.zeros_like(oidx)
    needed_fills = []
    if (osid < 0).any() and outer.attrs.get("fill") is not None:
        needed_fills.append(outer.attrs["fill"])
    for j, value in enumerate(outer.inputs):
        reads = osid == j
        if not reads.any():
            continue
        node = inner.get(j)
        if node is None:
            sid[reads] = slot(value)
            idx[reads] = oidx[reads]
            continue
        qsid, qidx = raster_index_map(node.attrs["regions"], _numel(graph, node.outputs[0]))
        through_sid, through_idx = qsid[oidx[reads]], qidx[oidx[reads]]
        if (through_sid < 0).any() and node.attrs.get("fill") is not None:
            needed_fills.append(node.attrs["fill"])
        remap = np.array([slot(v) for v in node.inputs] + [-1], dtype=np.int64)
        sid[reads] = remap[through_sid]  # -1 indexes the trailing -1: still unwritten
        idx[reads] = np.where(through_sid < 0, 0, through_idx)
    if any(not _same_fill(f, needed_fills[0]) for f in needed_fills[1:]):
        return None  # two different fill values cannot come from one raster
    budget = len(outer.attrs["regions"]) + sum(len(n.attrs["regions"]) for n in inner.values())
    shape = graph.specs[out].shape
    regions = fit_regions(sid.reshape(shape), idx.reshape(shape), budget)
    if regions is None:
        return None
    fitted = [Region.of(r) for r in regions]
    used = sorted({r.src for r in fitted})
    if not used:  # all fill; a raster still needs one source, so keep the first it had
        sources, used = [outer.inputs[0]], [0]
    renumber = {old: new for new, old in enumerate(used)}
    regions = [replace(r, src=renumber[r.src]).to_list() for r in fitted]
    fill = needed_fills[0] if needed_fills and (sid < 0).any() else None
    attrs = dict(outer.attrs, regions=regions, fill=fill)
    return [sources[i] for i in used], attrs


def _fits_maps(graph: Graph, outer: Node, inner: dict[int, Node]) -> bool:
    sizes = [_numel(graph, outer.outputs[0])] + [_numel(graph, n.outputs[0]) for n in inner.values()]
    return max(sizes) <= MAX_MAP_ELEMENTS


def merge_vertical(graph: Graph) -> bool:
    """Let every raster read through the rasters it reads from; True when any raster changed."""
    producers = graph.producers()
    changed = False
    for node in graph.nodes:
        if node.op != "raster":
            continue
        inner = {j: producers[v] for j, v in enumerate(node.inputs)
                 if v in producers and producers[v].op == "raster"}
        if not inner or not _fits_maps(graph, node, inner):
            continue
        merged = _compose(graph, node, inner)
        if merged is None and len(inner) > 1:
            # One troublesome source should not stop the others from merging.
            for j in list(inner):
                merged = _compose(graph, node, {j: inner[j]})
                if merged is not None:
                    break
        if merged is not None:
            node.inputs, node.attrs = merged
            changed = True
    return changed


# ---- identity and horizontal -------------------------------------------------------------------------

def _is_identity(graph: Graph, node: Node) -> bool:
    if node.op != "raster" or len(node.inputs) != 1:
        return False
    src, out = node.inputs[0], node.outputs[0]
    if graph.specs[src] != graph.specs[out] or _numel(graph, out) > MAX_MAP_ELEMENTS:
        return False
    sid, idx = raster_index_map(node.attrs["regions"], _numel(graph, out))
    return bool((sid == 0).all() and np.array_equal(idx, np.arange(idx.size)))


def _rename_uses(graph: Graph, old: str, new: str) -> None:
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]


def _replace_value(graph: Graph, producers: dict[str, Node], old: str, new: str) -> bool:
    """Make readers of `old` read `new`. A graph output keeps its name: `new`'s producer takes it over."""
    if old not in graph.outputs:
        _rename_uses(graph, old, new)
        return True
    producer = producers.get(new)
    if producer is None or new in graph.outputs:
        return False  # an input, constant or another output cannot be renamed
    producer.outputs = [old if o == new else o for o in producer.outputs]
    _rename_uses(graph, new, old)
    producers[old] = producer
    return True


def _drop_node(graph: Graph, node: Node) -> None:
    graph.nodes = [n for n in graph.nodes if n is not node]  # by identity: equal nodes may differ in place


def remove_identity_rasters(graph: Graph) -> bool:
    """Drop rasters that copy a tensor onto an identical one; True when any went."""
    changed = False
    producers = graph.producers()
    for node in list(graph.nodes):
        if _is_identity(graph, node) and _replace_value(graph, producers, node.outputs[0], node.inputs[0]):
            _drop_node(graph, node)
            changed = True
    return changed
