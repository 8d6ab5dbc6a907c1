"""Placement search: the cheapest backend per node under the cost model, by dynamic programming.

Nodes are taken in topological order; the state is the backend of the previous node. Staying on a backend
adds the node's cost, less what the backend saves by fusing it into the previous node; switching also opens
a partition (its scheduling cost plus SWITCH_S, the hand-over between thread pools) and pays the transfer of the previous node's outputs when either side
does not work on host memory. With B backends this is
O(nodes x B^2): a few milliseconds for ResNet-50. The switch count in topological order bounds the number
of partitions the partitioner will cut, so when it exceeds `max_partitions` the scheduling cost is raised
and the DP runs again, which trades a little modelled compute for fewer fragments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from edgerun.search.cost_model import CostTable

MAX_PARTITIONS = 32
# What a switch between backends costs beyond the new partition's call: the threads of the backend left
# behind still spin (ORT's pool, numpy's BLAS threads busy-wait for milliseconds) while the next one works.
# On MobileNetV2 a 3-node reference head (its GEMV modelled 2 us cheaper than ORT's) beside spinning ORT made
# every call 1.7x slower (8.0 against 4.6 ms, idle machine); a switch must promise more than this to be made.
SWITCH_S = 5e-5


@dataclass(frozen=True)
class SearchResult:
    backend_of: list[str]  # per node, in graph order
    seconds: float  # modelled latency of the whole graph
    switches: int  # partitions opened, counted along the topological order


def search_placement(table: CostTable, *, max_partitions: int = MAX_PARTITIONS,
                     partition_scale: float = 1.0) -> SearchResult:
    while True:
        result = _dp(table, partition_scale)
        if result.switches <= max_partitions or partition_scale > 1e6:
            return result
        partition_scale *= 4


def _dp(table: CostTable, scale: float) -> SearchResult:
    # Plain Python floats: with two or three backends, numpy's per-call overhead would dominate the loop.
    seconds = table.seconds.tolist()
    n, nb = len(seconds), len(table.backends)
    if n == 0:
        return SearchResult([], 0.0, 0)
    open_cost = (table.partition_s * scale).tolist()
    per_byte = table.transfer_s_per_byte.tolist()
    latency = table.transfer_latency_s.tolist()
    out_bytes = table.out_bytes.tolist()
    saving = table.fused_saving.tolist()
    backends = range(nb)
    best = [seconds[0][b] + open_cost[b] for b in backends]
    choice = [[0] * nb for _ in range(n)]
    for k in range(1, n):
        row, handed, fused = seconds[k], out_bytes[k - 1], saving[k]
        new = []
        for b in backends:
            from_b, total = b, best[b] - fused[b]
            for a in backends:
                if a != b:
                    switch = best[a] + open_cost[b] + SWITCH_S + latency[a] + latency[b] + (per_byte[a] + per_byte[b]) * handed
                    if switch < total:
                        from_b, total = a, switch
            choice[k][b] = from_b
            new.append(total + row[b])
        best = new
    last = min(backends, key=lambda b: best[b])
    if not math.isfinite(best[last]):
        raise ValueError("no backend supports some node (the reference backend should support all)")
    path = [last]
    for k in range(n - 1, 0, -1):
        path.append(choice[k][path[-1]])
    path.reverse()
    switches = 1 + sum(1 for a, b in pairwise(path) if a != b)
    return SearchResult([table.backends[b] for b in path], float(best[last]), switches)
