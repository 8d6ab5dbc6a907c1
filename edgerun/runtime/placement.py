"""Placement: which backend runs each node, from a preference list, forced placements, and supports().

Rules, in order: a forced placement {node name: backend} wins when that backend supports the node (else a
warning and the usual rules); otherwise the first backend in the preference list that supports the node;
otherwise the reference backend, which supports every atomic op and raster. The search (cost model plus
measurement) produces a forced placement for every node and passes it here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from edgerun.backends.base import Backend
from edgerun.backends.registry import get_backend
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph

FALLBACK = "reference"


def resolve_backends(backends: Sequence[str | Backend] | None,
                     placement: Mapping[str, str] | None = None) -> dict[str, Backend]:
    """Backend instances by name: the preference list (in order), those named by `placement`, and reference."""
    resolved: dict[str, Backend] = {}
    for b in [*(backends or [FALLBACK]), *sorted(set((placement or {}).values())), FALLBACK]:
        backend = b if isinstance(b, Backend) else get_backend(b)
        resolved.setdefault(backend.name, backend)
    return resolved


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
