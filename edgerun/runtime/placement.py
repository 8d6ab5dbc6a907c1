"""Placement: which backend runs each node, from a preference list, forced placements, and supports().

Rules, in order: a forced placement {node name: backend} wins when that backend supports the node (else a
warning and the usual rules); otherwise the first backend in the preference list that supports the node;
otherwise the reference backend, which supports every atomic op and raster and runs any composite
decomposed. The search (cost model plus measurement) produces a forced placement for every node and
passes it here.

Composites: the graph arrives with the composites some candidate backend keeps whole (Backend.composites);
after placement, `lower_unclaimed` decomposes each one placed on a backend that does not keep it, and its
pieces stay on that backend (or go to reference, for a piece that backend cannot run).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence

from edgerun.backends.base import Backend
from edgerun.backends.registry import get_backend
from edgerun.errors import EdgerunError
from edgerun.ir.decompose import KeepWhole, decomposed
from edgerun.ir.graph import Graph, Node

FALLBACK = "reference"


def resolve_backends(backends: Sequence[str | Backend] | None,
                     placement: Mapping[str, str] | None = None) -> dict[str, Backend]:
    """Backend instances by name: the preference list (in order), those named by `placement`, and reference."""
    resolved: dict[str, Backend] = {}
    for b in [*(backends or [FALLBACK]), *sorted(set((placement or {}).values())), FALLBACK]:
        backend = b if isinstance(b, Backend) else get_backend(b)
        resolved.setdefault(backend.name, backend)
    return resolved


def claimed_by(backends: Iterable[Backend]) -> KeepWhole:
    """The decomposition filter for a set of candidate backends: keep a composite some backend runs whole."""
    candidates = list(backends)
    return lambda node, graph: any(b.keeps_whole(node, graph) for b in candidates)


def lower_unclaimed(graph: Graph, assignment: Mapping[str, str],
                    backends: Mapping[str, Backend]) -> tuple[Graph, dict[str, str]]:
    """Decompose every composite placed on a backend that does not keep it whole; the pieces' placement."""
    origins: dict[str, str] = {}

    def keep(node: Node, current: Graph) -> bool:
        placed_on = assignment.get(origins.get(node.name, node.name), FALLBACK)
        return backends[placed_on].keeps_whole(node, current)

    lowered = decomposed(graph, keep, origins, bodies=False)  # a control-flow node's backend runs its bodies
    if lowered is graph:
        return graph, dict(assignment)
    placed = {}
    for node in lowered.nodes:
        name = assignment.get(node.name) or assignment.get(origins.get(node.name, ""), FALLBACK)
        placed[node.name] = name if backends[name].supports(node, lowered) else FALLBACK
    return lowered, placed


def assign_backends(graph: Graph, backends: Mapping[str, Backend], preference: Sequence[str],
                    placement: Mapping[str, str] | None = None) -> dict[str, str]:
    """Node name -> backend name for every node of `graph`."""
    placement = dict(placement or {})
    names = {n.name for n in graph.nodes}
    unknown = sorted(set(placement) - names)
    if unknown:
        raise EdgerunError(f"placement names nodes the program does not have: {unknown[:5]}"
                           f"{' ...' if len(unknown) > 5 else ''}")
    assignment: dict[str, str] = {}
    for node in graph.nodes:
        forced = placement.get(node.name)
        if forced is not None:
            if backends[forced].supports(node, graph):
                assignment[node.name] = forced
                continue
            warnings.warn(f"backend {forced!r} does not support node {node.name!r} ({node.op}); "
                          "placing it by preference instead", RuntimeWarning, stacklevel=3)
        assignment[node.name] = next((b for b in preference if backends[b].supports(node, graph)), FALLBACK)
    return assignment
