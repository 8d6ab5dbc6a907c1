"""Attention as one dispatch: scores, softmax and the weighted sum of values, one workgroup per query row.

The LLM step writes attention against a KV cache as two score matmuls (the cache and the new rows), each
masked by one elementwise node (`where(mask, scores, -inf)`), their concat along the keys, a softmax, two
slices of the probabilities and two value matmuls added:

    s1 = e1(q1 @ k1)   s2 = e2(q2 @ k2)   p = softmax(concat(s1, s2, -1), -1)
    out = p[..., :C] @ v1 + p[..., C:] @ v2                                   (or v2's product first)

Unfused that is three dispatches (scores, softmax, values); here it is one. Workgroup o (of batch b, row r)
computes its row's C + T scores (each thread a strided share: the score matmul's dot product in its order,
the mask node's WGSL on it), stores them in the softmax output's range (its scratch), reduces the row's max
and then the sum of exp(score - max) in workgroup memory, stores each probability as the softmax kernel
computes it (exp(score - max) / total), and after a barrier each thread sums probability x value for its
share of the output columns, in the value matmuls' order. The only arithmetic that differs from the
unfused kernels is the order of the softmax's sum (a tree over 64 partial sums instead of one running sum).

Only the cells in use: where a half's mask is `where(keep, scores, -inf)` with a constant -inf, the workgroup
first reads its row of `keep` (one load per cell, on the device, every call: the LLM step computes it from the
position) and stops every loop of that half at used = 1 + the last kept cell (at least 1). The cells after
it score -inf whatever their keys, so their probabilities are exactly 0 and their value terms 0 x v = 0:
a decode step at position 10 of a 512-cell cache reads 11 cells of keys and values, not 512. The loops keep
the whole-width loop's thread for each cell, so the outputs are bit for bit those of reading every cell,
wherever the skipped value rows are finite (a NaN or inf left in an unused cache cell made the whole-width
output NaN; here it is never read). Nothing is assumed about what the mask means: it is read, not inferred.

Matched only where every intermediate has no reader outside the pattern and is no partition output, all
float32, rank 3 with one batch size, the concat and slices exactly that (checked on the regions), and
within the dispatch's binding cap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgerun.backends.webgpu.wgsl import (
    ELEMENTWISE,
    PRELUDE,
    STORAGE_TYPE,
    WORKGROUP,
    Kernel,
    broadcast_strides,
    elementwise_expr,
)
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import regions_of


@dataclass
class ScoreHalf:
    """One half of the keys: the score matmul, its optional elementwise node, the probability slice and the
    value matmul."""

    matmul: Node
    mask: Node | None
    slice: Node
    values: Node


@dataclass
class Attention:
    halves: tuple[ScoreHalf, ScoreHalf]  # the cache's keys first (the concat's order)
    concat: Node
    softmax: Node
    add: Node  # the value matmuls' sum: the pattern's output

    @property
    def nodes(self) -> list[Node]:
        found = [self.concat, self.softmax, self.add]
        for h in self.halves:
            found += [n for n in (h.matmul, h.mask, h.slice, h.values) if n is not None]
        return found


def find_attention(graph: Graph, alias: Mapping[str, str], outputs: set[str], max_bindings: int) -> list[Attention]:
    """Every attention pattern of the module doc in `graph` (see there for what is matched)."""
    producer = {o: n for n in graph.nodes for o in n.outputs}
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v:
                readers.setdefault(alias.get(v, v), []).append(n)
    found = []
    for softmax in graph.nodes:
        if softmax.op == "softmax":
            match = _match(softmax, graph, producer, readers, alias, outputs)
            if match is not None and len(attention_bindings(match, alias)) + 2 <= max_bindings:
                found.append(match)
    return found


def _match(softmax: Node, graph: Graph, producer: dict[str, Node], readers: dict[str, list[Node]],
           alias: Mapping[str, str], outputs: set[str]) -> Attention | None:
    def only_reader(v: str, count: int = 1) -> list[Node] | None:
        users = readers.get(v, [])
        if v in outputs or v in alias or len(users) != count or graph.specs[v].dtype is not DType.float32:
            return None
        return users

    spec = graph.specs[softmax.outputs[0]]
    if spec.rank != 3 or int(softmax.attrs.get("axis", -1)) % 3 != 2:
        return None
    concat = producer.get(softmax.inputs[0])
    slices = only_reader(softmax.outputs[0], 2)
    if concat is None or concat.op != "raster" or slices is None or only_reader(concat.outputs[0]) is None:
        return None
    if len(concat.inputs) != 2 or concat.inputs[0] == concat.inputs[1]:
        return None
    scores = [graph.specs[v] for v in concat.inputs]
    b, r = spec.shape[:2]
    if any(s.shape[:2] != (b, r) or s.rank != 3 for s in scores):
        return None
    widths = [s.shape[2] for s in scores]
    if not _is_concat(concat, graph, widths) or slices[0].op != "raster" or slices[1].op != "raster":
        return None
    by_start = {_slice_start(s, graph, spec.shape): s for s in slices}
    if set(by_start) != {0, widths[0]} or any(graph.specs[by_start[at].outputs[0]].shape[2] != width
                                              for at, width in zip((0, widths[0]), widths)):
        return None
    halves = []
    value_matmuls = []
    for k, v in enumerate(concat.inputs):
        if only_reader(v) is None:
            return None
        node = producer.get(v)
        mask = None
        if node is not None and node.op != "matmul":
            mask = node
            inner = [u for u in node.inputs if u and producer.get(u) is not None and producer[u].op == "matmul"
                     and only_reader(u) is not None]
            if node.op not in ELEMENTWISE or len(inner) != 1 or node.inputs.count(inner[0]) != 1 or any(
                    graph.specs[u].dtype is DType.float16 for u in node.inputs if u):
                return None
            node = producer[inner[0]]
        if node is None or node.op != "matmul" or graph.specs[node.outputs[0]].shape != (b, r, widths[k]):
            return None
        q, key = (graph.specs[u] for u in node.inputs)
        if q.rank != 3 or q.shape[:2] != (b, r) or key.shape != (b, q.shape[2], widths[k]):
            return None
        piece = by_start[0 if k == 0 else widths[0]]
        users = only_reader(piece.outputs[0])
        if users is None or users[0].op != "matmul" or users[0].inputs[0] != piece.outputs[0]:
            return None
        value_matmuls.append(users[0])
        value = graph.specs[users[0].inputs[1]]
        if value.rank != 3 or value.shape[:2] != (b, widths[k]) or any(
                graph.specs[u].dtype is not DType.float32 for u in (*node.inputs, users[0].inputs[1])):
            return None
        halves.append(ScoreHalf(node, mask, piece, users[0]))
    outs = [only_reader(m.outputs[0]) for m in value_matmuls]
    if outs[0] is None or outs[1] is None or outs[0][0] is not outs[1][0]:
        return None
    add = outs[0][0]
    if add.op != "add" or graph.specs[add.outputs[0]].shape != graph.specs[value_matmuls[0].outputs[0]].shape \
            or graph.specs[add.outputs[0]].dtype is not DType.float32:
        return None
    if graph.specs[value_matmuls[1].outputs[0]].shape != graph.specs[add.outputs[0]].shape:
        return None
    return Attention((halves[0], halves[1]), concat, softmax, add)


def _copies(node: Node, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """(source input, source flat index) of each output element of raster `node`, or None with a fill or a
    gap."""
    if node.attrs.get("fill") is not None:
        return None
    n = graph.specs[node.outputs[0]].numel
    src = np.full(n, -1)
    at = np.full(n, -1)
    for region in regions_of(node.attrs):
        dst, from_ = region.index_grids()
        if dst.size and (dst.min() < 0 or dst.max() >= n):
            return None
        src[dst] = region.src
        at[dst] = from_
    return None if (src < 0).any() else (src, at)


def _is_concat(node: Node, graph: Graph, widths: list[int]) -> bool:
    copies = _copies(node, graph)
    if copies is None:
        return False
    b, r, _ = graph.specs[node.outputs[0]].shape
    n = sum(widths)
    j = np.arange(n)
    rows = np.arange(b * r)[:, None]
    want_src = np.broadcast_to((j >= widths[0]).astype(int), (b * r, n)).reshape(-1)
    want_at = np.where(j < widths[0], rows * widths[0] + j, rows * widths[1] + j - widths[0]).reshape(-1)
    return bool((copies[0] == want_src).all() and (copies[1] == want_at).all())


def _slice_start(node: Node, graph: Graph, shape: tuple[int, ...]) -> int | None:
    """Where raster `node` starts along the last axis when it is a contiguous slice of it, else None."""
    copies = _copies(node, graph)
    if copies is None or (copies[0] != 0).any():
        return None
    b, r, n = shape
    width = graph.specs[node.outputs[0]].shape[2]
    if graph.specs[node.outputs[0]].shape[:2] != (b, r):
        return None
    start = int(copies[1][0])
    rows = np.arange(b * r)[:, None] * n + start + np.arange(width)
    return start if 0 <= start <= n - width and (copies[1] == rows.reshape(-1)).all() else None


def _broadcast_index(graph: Graph, value: str, shape: tuple[int, int, int]) -> str:
    """The flat index of `value` broadcast to `shape` at (bb, rr, jj)."""
    strides = broadcast_strides(graph.specs[value].shape, shape)
    return f"bb * {strides[0]} + rr * {strides[1]} + jj * {strides[2]}"


def _first_of_thread(offset: int) -> str:
    """The first j >= offset that thread `tid` takes in the strided share j = tid, tid + 64, ...: each cell is
    summed by the thread that summed it when the loop ran over all the cells, so the partial sums are those of
    the whole-width loop, less terms that are exactly 0."""
    if offset == 0:
        return "tid"
    return f"tid + ((max({offset} - tid, 0) + {WORKGROUP - 1}) / {WORKGROUP}) * {WORKGROUP}"


def _masked_to_minus_inf(half: ScoreHalf, graph: Graph, alias: Mapping[str, str]) -> str | None:
    """The condition of `half`'s mask when it is `where(keep, scores, -inf)` with a constant -inf, else None."""
    mask = half.mask
    if mask is None or mask.op != "where" or len(mask.inputs) != 3 or mask.inputs[1] != half.matmul.outputs[0]:
        return None
    keep, other = mask.inputs[0], mask.inputs[2]
    minus_inf = graph.constants.get(alias.get(other, other))
    if keep == mask.inputs[1] or minus_inf is None or graph.specs[keep].dtype is not DType.bool:
        return None
    values = np.asarray(minus_inf, np.float64)
    return keep if values.size and bool(np.all(np.isneginf(values))) else None


def attention_bindings(match: Attention, alias: Mapping[str, str]) -> list[str]:
    """The values the kernel reads, each once, in binding order."""
    read: list[str] = []
    for h in match.halves:
        mask_inputs = [u for u in h.mask.inputs if u and u != h.matmul.outputs[0]] if h.mask is not None else []
        for v in (*h.matmul.inputs, *mask_inputs, h.values.inputs[1]):
            v = alias.get(v, v)
            if v not in read:
                read.append(v)
    return read


def attention_kernel(match: Attention, graph: Graph, alias: Mapping[str, str]) -> Kernel:
    """The one-dispatch kernel of `match` (the module doc)."""
    bound = attention_bindings(match, alias)
    slot = {v: k for k, v in enumerate(bound)}

    def load(v: str) -> Callable[[str], str]:
        return lambda index: f"in{slot[alias.get(v, v)]}[{index}]"

    softmax_out, out = match.softmax.outputs[0], match.add.outputs[0]
    b, r, n = graph.specs[softmax_out].shape
    d = graph.specs[out].shape[2]
    widths = [graph.specs[h.matmul.outputs[0]].shape[2] for h in match.halves]
    offsets = [0, widths[0]]
    used_lines: list[str] = []  # each half's cell count in use, `used{k}`: a bound from its mask, or its width
    score_loops: list[str] = []
    for k, h in enumerate(match.halves):
        q, key = h.matmul.inputs
        width, offset = widths[k], offsets[k]
        depth = graph.specs[q].shape[2]
        qrows = graph.specs[q].shape[1]
        qbase = f"bb * {qrows * depth} + rr * {depth}"
        kbase = f"bb * {depth * width} + jj"
        expr = "acc_r"
        if h.mask is not None:
            args = []
            for u in h.mask.inputs:
                if u == h.matmul.outputs[0]:
                    args.append("acc_r")
                else:
                    args.append(load(u)(_broadcast_index(graph, u, (b, r, width))))
            expr = elementwise_expr(h.mask, graph, args)
        keep = _masked_to_minus_inf(h, graph, alias)
        if keep is None:
            used_lines.append(f"let used{k}: i32 = {width};")
        else:  # 1 + the row's last kept cell (at least 1): the cells after it score -inf and weigh exactly 0
            used_lines += [
                f"var last{k}: i32 = 0;",
                f"if (live) {{ for (var jj: i32 = tid; jj < {width}; jj = jj + {WORKGROUP}) {{ "
                f"if ({load(keep)(_broadcast_index(graph, keep, (b, r, width)))} != 0u) {{ last{k} = jj + 1; }} }} }}",
                f"redi[tid] = last{k};",
                "workgroupBarrier();",
                f"for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{",
                "  if (tid < half) { redi[tid] = max(redi[tid], redi[tid + half]); }",
                "  workgroupBarrier();",
                "}",
                f"let used{k} = max(redi[0], 1);",
                "workgroupBarrier();",
            ]
        score_loops += [
            f"for (var j: i32 = {_first_of_thread(offset)}; j < {offset} + used{k}; j = j + {WORKGROUP}) {{",
            f"  let jj = j - {offset};",
            "  var acc_r: f32 = 0.0;",
            f"  for (var h: i32 = 0; h < {depth}; h = h + 1) {{ acc_r = acc_r + {load(q)(f'{qbase} + h')} * "
            f"{load(key)(f'{kbase} + h * {width}')}; }}",
            f"  let score = {expr};",
            "  out0[row + j] = score;",
            "  m = e_max(m, score);",
            "}",
        ]
    cells = [f"for (var j: i32 = {_first_of_thread(offsets[k])}; j < {offsets[k]} + used{k}; "
             f"j = j + {WORKGROUP}) {{ BODY }}" for k in range(2)]
    sums = []
    for k, h in enumerate(match.halves):
        value = h.values.inputs[1]
        sums += [f"var a{k}: f32 = 0.0;",
                 f"for (var j: i32 = 0; j < used{k}; j = j + 1) {{ a{k} = a{k} + out0[row + {offsets[k]} + j] * "
                 f"{load(value)(f'bb * {widths[k] * d} + j * {d} + dd')}; }}"]
    first = 0 if match.add.inputs[0] == match.halves[0].values.outputs[0] else 1
    total_expr = f"(a{first} + a{1 - first})"
    in_decls = [f"@group(0) @binding({k}) var<storage, read_write> in{k}: array<{STORAGE_TYPE[graph.specs[v].dtype]}>;"
                for k, v in enumerate(bound)]
    nb = len(bound)
    rows = b * r
    used_block = "\n  ".join(used_lines)
    score_lines = "\n    ".join(score_loops)
    sum_lines = "\n      ".join(sums)
    exp_loops = "\n    ".join(c.replace("BODY", "part = part + exp(out0[row + j] - mx);") for c in cells)
    prob_loops = "\n    ".join(c.replace("BODY", "out0[row + j] = exp(out0[row + j] - mx) / total;") for c in cells)
    source = f"""{PRELUDE}
{chr(10).join(in_decls)}
@group(0) @binding({nb}) var<storage, read_write> out0: array<f32>;
@group(0) @binding({nb + 1}) var<storage, read_write> out1: array<f32>;
var<workgroup> red: array<f32, {WORKGROUP}>;
var<workgroup> redi: array<i32, {WORKGROUP}>;
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let o = wid.x + wid.y * nwg.x;
  let tid = i32(lid.x);
  let live = o < {rows}u;
  let bb = i32(o / {r}u);
  let rr = i32(o % {r}u);
  let row = i32(o) * {n};
  {used_block}
  var m = e_bits(0xff800000u);
  if (live) {{
    {score_lines}
  }}
  red[tid] = m;
  workgroupBarrier();
  for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{
    if (tid < half) {{ red[tid] = e_max(red[tid], red[tid + half]); }}
    workgroupBarrier();
  }}
  let mx = red[0];
  workgroupBarrier();
  var part: f32 = 0.0;
  if (live) {{
    {exp_loops}
  }}
  red[tid] = part;
  workgroupBarrier();
  for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{
    if (tid < half) {{ red[tid] = red[tid] + red[tid + half]; }}
    workgroupBarrier();
  }}
  let total = red[0];
  if (live) {{
    {prob_loops}
  }}
  storageBarrier();
  workgroupBarrier();
  if (live) {{
    for (var dd: i32 = tid; dd < {d}; dd = dd + {WORKGROUP}) {{
      {sum_lines}
      out1[i32(o) * {d} + dd] = {total_expr};
    }}
  }}
}}
"""
    return Kernel(source, [*bound, alias.get(softmax_out, softmax_out), alias.get(out, out)], rows * WORKGROUP,
                  [n.name for n in match.nodes], label="attention:workgroup", n_outputs=2)
