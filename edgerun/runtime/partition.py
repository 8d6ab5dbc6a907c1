"""The partitioner: cut a graph into maximal connected pieces that each run on one backend, without cycles.

Input: a graph in topological order and a backend name per node. Nodes are visited in order; each joins
(and merges) the partitions of its same-backend producers when that cannot create a cycle (a node with no
such producer tries the backend's latest partition, so sibling branches share one), else starts a new
partition. A merge creates a cycle exactly when some partition outside the merged set is both reachable from
it and reaches back into it (a path partition -> other -> partition), which is tested with ancestor sets kept
as bitmasks over partition ids. Since nodes arrive in topological order, a new node only adds edges into its
own partition, so this test at each join is complete.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edgerun.errors import EdgerunError, VerificationError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.subgraphs import bodies_of, body_names, is_control_flow


@dataclass
class Partition:
    index: int  # position in the execution order
    backend: str
    nodes: list[Node]  # in graph (topological) order
    inputs: list[str] = field(default_factory=list)  # read from outside: graph inputs, other partitions
    outputs: list[str] = field(default_factory=list)  # read by other partitions, or graph outputs

    def subgraph(self, graph: Graph) -> Graph:
        """A standalone graph of this partition: its boundary values become inputs and outputs."""
        used = {v for n in self.nodes for v in (*n.inputs, *n.outputs) if v} | set(self.inputs)
        nodes = [Node(n.op, list(n.inputs), list(n.outputs), n.attrs, n.meta, n.name) for n in self.nodes]
        return Graph(list(self.inputs), list(self.outputs), nodes,
                     {v: graph.specs[v] for v in used},
                     {v: graph.constants[v] for v in used if v in graph.constants},
                     subgraphs={k: body for n in self.nodes if is_control_flow(n.op)
                                for k, body in zip(body_names(n), bodies_of(n, graph))})

    @property
    def label(self) -> str:
        return f"p{self.index}:{self.backend}"


def partition_graph(graph: Graph, assignment: Mapping[str, str]) -> list[Partition]:
    """Partitions of `graph` (nodes in topological order) for `assignment` (node name -> backend), in
    an order where every partition follows the producers of its inputs."""
    producer = {out: k for k, n in enumerate(graph.nodes) for out in n.outputs}
    parent: dict[int, int] = {}  # union-find over partition ids

    def find(p: int) -> int:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    node_part: list[int] = []
    members: dict[int, list[int]] = {}
    backend_of: dict[int, str] = {}
    anc: dict[int, int] = {}  # live partition id -> bitmask of its ancestor partitions
    latest: dict[str, int] = {}  # backend -> partition that took its most recent node
    for k, node in enumerate(graph.nodes):
        try:
            backend = assignment[node.name]
        except KeyError:
            raise EdgerunError(f"node {node.name!r} ({node.op}) has no backend assigned") from None
        preds = {find(node_part[producer[i]]) for i in node.inputs if i in producer}
        pred_anc = 0
        for q in preds:
            pred_anc |= anc[q] | (1 << q)
        candidates = sorted((q for q in preds if backend_of[q] == backend), key=lambda q: -len(members[q]))
        if not candidates and backend in latest:
            # No producer on this backend: try the most recent partition of the backend anyway (a sibling
            # branch), since every partition boundary costs a dispatch and, for a delegate, a transfer.
            candidates = [find(latest[backend])]
        chosen: list[int] = []
        mask = 0
        for c in candidates:
            trial = mask | (1 << c)
            reach_into = pred_anc
            for m in (*chosen, c):
                reach_into |= anc[m]
            reached_from = 0
            for x, a in anc.items():
                if a & trial:
                    reached_from |= 1 << x
            if reached_from & reach_into & ~trial == 0:
                chosen.append(c)
                mask = trial
        if not chosen:
            pid = len(parent)
            parent[pid] = pid
            members[pid], backend_of[pid], anc[pid] = [], backend, pred_anc
        else:
            pid = chosen[0]
            new_anc = pred_anc
            for m in chosen:
                new_anc |= anc[m]
            for m in chosen[1:]:
                parent[m] = pid
                members[pid].extend(members.pop(m))
                del backend_of[m], anc[m]
            new_anc &= ~mask
            for x, a in anc.items():
                if a & mask:
                    a = (a & ~mask) | (1 << pid)
                if a & (1 << pid):
                    a |= new_anc  # descendants inherit the ancestors the merge brought in
                anc[x] = a
            anc[pid] = new_anc
        members[pid].append(k)
        node_part.append(pid)
        latest[backend] = pid
    return _ordered_partitions(graph, {p: sorted(ks) for p, ks in members.items()}, backend_of,
                               [find(p) for p in node_part], producer)


def _ordered_partitions(graph: Graph, members: dict[int, list[int]], backend_of: dict[int, str],
                        node_part: list[int], producer: dict[str, int]) -> list[Partition]:
    succ: dict[int, set[int]] = {p: set() for p in members}
    indegree = dict.fromkeys(members, 0)
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            if i in producer and node_part[producer[i]] != node_part[k]:
                src = node_part[producer[i]]
                if node_part[k] not in succ[src]:
                    succ[src].add(node_part[k])
                    indegree[node_part[k]] += 1
    ready = [(ks[0], p) for p, ks in members.items() if indegree[p] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, p = heapq.heappop(ready)
        order.append(p)
        for s in succ[p]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (members[s][0], s))
    if len(order) != len(members):
        raise VerificationError("partitioning produced a cycle between partitions")  # a bug, never input
    parts = [Partition(i, backend_of[p], [graph.nodes[k] for k in members[p]]) for i, p in enumerate(order)]
    _set_boundaries(graph, parts)
    return parts


def _set_boundaries(graph: Graph, parts: Sequence[Partition]) -> None:
    owner = {out: p.index for p in parts for n in p.nodes for out in n.outputs}
    exported: set[str] = set(graph.outputs)
    for p in parts:
        seen: set[str] = set()
        for n in p.nodes:
            for i in n.inputs:
                if i and i not in graph.constants and owner.get(i) != p.index and i not in seen:
                    seen.add(i)
                    p.inputs.append(i)
                    exported.add(i)
    for p in parts:
        p.outputs = [o for n in p.nodes for o in n.outputs if o in exported]


def check_acyclic(parts: Sequence[Partition], graph: Graph) -> None:
    """Raise VerificationError unless every partition reads only values made before it runs."""
    available = set(graph.inputs) | set(graph.constants)
    for p in parts:
        inside: set[str] = set()
        for n in p.nodes:
            for i in n.inputs:
                if i and i not in available and i not in inside:
                    raise VerificationError(f"partition {p.label} reads {i!r} before it is produced: "
                                            "the partitions form a cycle or are out of order")
            inside.update(n.outputs)
        available |= inside
    names = [n.name for p in parts for n in p.nodes]
    if sorted(names) != sorted(n.name for n in graph.nodes):
        raise VerificationError("partitions do not cover every node exactly once")
