"""`cache_attention` as one dispatch: rotary, scores, window, soft-cap, softmax, values and the cache append.

The IR op (ir/ops/cache_attention_ops.py) is claimed whole: the kernel is written from its attributes, not
found in a decomposition. One workgroup per (query head, query row): it rotates its query row by the row's
position (rotate-half over the first rotary_dim dims, the table row clamped like the op's gather) and scales
it into workgroup memory. The keys the row may see are the cache cells lo .. start - 1 and the chunk's own
rows up to itself (lo = position - window + 1 with a window, else 0); its 64 threads compute their scores
in strided shares (the dot product, a new row's key rotated on the fly, then the soft-cap
`cap * tanh(s / cap)`) into the row's range of a scratch value, reduce the row's max and the sum of
exp(score - max) in workgroup memory, store each probability there (exp(score - max) / total, as the softmax
kernel computes it), and after a barrier each thread sums probability x value for its share of the head's
dims. Cells at or past `start`, and keys outside the window, are never read, so decode attention costs what
the position costs, not the context, and garbage in unused cells never reaches the output. The new rows are appended by two small parts (`append_parts`: the rotated keys, the values, one thread an
element, at `start` clamped like update_slice's) that the lowering floats into the next dispatch after the
attention kernel, as it does an in-place update_slice (update.py): they cost no dispatch of their own where
they fit beside it. Where nothing reads a cache after the op and nothing in the partition reads its updated
value (update.py's rule; the LLM step's state) the updated cache shares the input's device range;
otherwise (fusion off, a cache read again later) a copy dispatch first copies both caches into the updated
values' ranges and the appends write there.

What the kernel does not handle is not claimed (`claimable`): other dtypes, attributes or inputs than the
op's current signature (a start per sequence, say), so the runtime runs the decomposition instead. Versus
the reference the arithmetic differs only in order (the softmax's sum is a tree over 64 partial sums, the
dot products run in dimension order): f32 tolerance, `test_backends_webgpu_ops`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from edgerun.backends.webgpu.wgsl import PRELUDE, STORAGE_TYPE, WORKGROUP, Kernel, shader_source
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.cache_attention_ops import LAYOUTS
from edgerun.ir.tensor_spec import TensorSpec

ATTRS = frozenset({"head_dim", "layout", "window", "softcap", "scale"})  # what the kernel reads
MAX_HEAD_DIM = 1024  # the query row lives in workgroup memory (4 KiB)


def claimable(node: Node, graph: Graph) -> bool:
    """Whether the kernel computes `node` exactly as the op defines it: float32 operands, one sequence (one
    start; a batched decode's B sequences run as the decomposition), rotary tables both there or both absent,
    and no attribute it does not know."""
    ins = node.inputs
    if set(node.attrs) - ATTRS or node.attrs.get("layout", "heads") not in LAYOUTS or len(ins) > 8:
        return False
    if len(node.outputs) != 3 or sum(bool(v) for v in ins[6:8]) == 1 or not all(ins[:6]):
        return False
    hd = int(node.attrs.get("head_dim", 0))
    start, cache = graph.specs[ins[5]], graph.specs[ins[3]]
    one_sequence = start.numel == 1 and (cache.rank == 3 or cache.shape[0] == 1)  # not a batched decode's B > 1
    return (0 < hd <= MAX_HEAD_DIM and one_sequence and start.dtype in (DType.int32, DType.int64)
            and all(graph.specs[v].dtype is DType.float32 for v in (*ins[:5], *ins[6:8]) if v))


def bindings(node: Node) -> int:
    """Storage buffers the attention kernel binds: its inputs, the output and the scores' scratch."""
    return sum(bool(v) for v in node.inputs) + 2


@dataclass
class _Dims:
    """The op's sizes, and WGSL for its indexing."""

    T: int
    heads: int
    kv: int
    hd: int
    cells: int
    layout: str
    rd: int  # rotary dims (0: no tables)
    positions: int  # table rows

    @staticmethod
    def of(node: Node, graph: Graph) -> _Dims:
        hd = int(node.attrs["head_dim"])
        q, k, cache = (graph.specs[node.inputs[j]] for j in (0, 1, 3))
        tables = [graph.specs[x] for x in node.inputs[6:8] if x]
        return _Dims(q.shape[0], q.shape[1] // hd, k.shape[1] // hd, hd, cache.shape[2],
                     node.attrs.get("layout", "heads"), tables[0].shape[1] if tables else 0,
                     tables[0].shape[0] if tables else 0)

    @property
    def scores(self) -> int:
        """Where the rotated new keys start in the scratch: after every row's C + T scores."""
        return self.heads * self.T * (self.cells + self.T)

    def key_at(self, c: str) -> str:
        """The flat index of cache cell `c`, dim d, kv head g: "heads" [1, kv, C, hd]; "keys_transposed"
        [kv, hd, C]."""
        return f"(g * {self.cells} + {c}) * {self.hd} + d" if self.layout == "heads" else f"(g * {self.hd} + d) * {self.cells} + {c}"

    def value_at(self, c: str, d: str = "d") -> str:
        return f"(g * {self.cells} + {c}) * {self.hd} + {d}"

    def table_row(self, position: str) -> str:
        """The table row the op's gather reads for `position`: clamped to the last row, a negative one
        counted from the end (numpy's take), and kept in range whatever it is."""
        last = max(self.positions - 1, 0)
        return f"clamp(select(min({position}, {last}), {position} + {self.positions}, {position} < 0), 0, {last})"

    def rotated(self, x: str, base: str, row: str, cos: str, sin: str) -> str:
        """Element d of the head row at flat `base` of binding `x`, turned by table row `row` of bindings `cos`
        and `sin` (rotate-half over the first rd dims; every index in range whichever branch a select takes)."""
        if not self.rd:
            return f"{x}[{base} + d]"
        half, at = self.rd // 2, f"{row} * {self.rd} + min(d, {self.rd - 1})"
        partner = f"select(1.0, -1.0, d < {half}) * {x}[{base} + select(d - {half}, d + {half}, d < {half})]"
        return f"select({x}[{base} + d], {x}[{base} + d] * {cos}[{at}] + {partner} * {sin}[{at}], d < {self.rd})"


def cache_attention_kernels(node: Node, graph: Graph, alias: Mapping[str, str]) -> list[Kernel]:
    """The dispatches of `node`: the attention kernel, after a copy of both caches into the updated caches'
    ranges where they are not updated in place (`alias` maps an in-place updated cache to its input's
    range). The appends are `append_parts`, placed by the lowering."""
    kernels = []
    if not in_place(node, alias):
        kernels.append(_copy_kernel(node, graph, alias))
    kernels.append(_attention_kernel(node, graph, alias))
    return kernels


def in_place(node: Node, alias: Mapping[str, str]) -> bool:
    return all(alias.get(out) == alias.get(cache, cache) for cache, out in zip(node.inputs[3:5], node.outputs[1:3]))


def _copy_kernel(node: Node, graph: Graph, alias: Mapping[str, str]) -> Kernel:
    """Both caches copied whole into the updated caches' ranges (threads over the larger)."""
    sizes = [graph.specs[v].numel for v in node.inputs[3:5]]
    lines = [f"if (idx < {sizes[0]}u) {{ out0[idx] = in0[idx]; }}", f"if (idx < {sizes[1]}u) {{ out1[idx] = in1[idx]; }}"]
    source = shader_source(["f32", "f32"], lines, ["f32", "f32"], max(sizes), status=False)
    values = [alias.get(v, v) for v in (*node.inputs[3:5], *node.outputs[1:3])]
    return Kernel(source, values, max(sizes), [node.name], label="cache_attention:copy", n_outputs=2)


@dataclass
class Append:
    """One cache's append: the lines of a kernel part reading `bound` (in0..) and storing into `written`
    (out0), over `threads` threads."""

    bound: list[str]
    written: str
    lines: list[str]
    in_types: list[str]
    threads: int


def append_parts(node: Node, graph: Graph, alias: Mapping[str, str]) -> list[Append]:
    """The k and v appends of `node`: each new row written at `start` clamped so the rows fit, as
    update_slice writes it, into the updated cache's range. The keys are the rotated ones the attention
    kernel left after the scores in its scratch (so an append binds three buffers, not five)."""
    dims = _Dims.of(node, graph)
    v, start = node.inputs[2], node.inputs[5]
    width = dims.kv * dims.hd
    head = [f"let t = i32(idx) / {width};", f"let g = (i32(idx) % {width}) / {dims.hd};",
            f"let d = i32(idx) % {dims.hd};", f"let c = clamp(i32(in1[0]), 0, {dims.cells - dims.T}) + t;"]
    start_type = STORAGE_TYPE[graph.specs[start].dtype]
    out = [alias.get(v, v) for v in node.outputs[1:3]]
    keys = f"out0[{dims.key_at('c')}] = in0[{dims.scores} + i32(idx)];"
    return [Append([scratch_of(node), alias.get(start, start)], out[0], [*head, keys], ["f32", start_type],
                   dims.T * width),
            Append([alias.get(x, x) for x in (v, start)], out[1], [*head, f"out0[{dims.value_at('c')}] = in0[idx];"],
                   ["f32", start_type], dims.T * width)]


def scratch_of(node: Node) -> str:
    """The attention kernel's scratch value: each row's scores and probabilities, then the rotated new keys."""
    return f"{node.name}.scratch"


def _attention_kernel(node: Node, graph: Graph, alias: Mapping[str, str]) -> Kernel:
    dims = _Dims.of(node, graph)
    T, heads, kv, hd, cells = dims.T, dims.heads, dims.kv, dims.hd, dims.cells
    q, k, v, k_cache, v_cache, start = node.inputs[:6]
    tables = [x for x in node.inputs[6:8] if x]
    group = heads // kv
    scale = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
    window, cap = int(node.attrs.get("window", 0) or 0), float(node.attrs.get("softcap", 0.0) or 0.0)
    inputs = (q, k, v, k_cache, v_cache, start, *tables)  # in0..in7; out0 the output, out1 the scratch
    rows = heads * T
    lo = f"max(pos - {window - 1}, 0)" if window else "0"
    first_new = f"max(t - {window - 1}, 0)" if window else "0"
    soft = f"{cap!r} * e_tanh(s0 / {cap!r})" if cap else "s0"
    width = cells + T  # a row's scratch: the scores, then the probabilities, of the keys it sees
    body = f"""
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let o = wid.x + wid.y * nwg.x;
  let tid = i32(lid.x);
  let start = i32(in5[0]);
  let live = o < {rows}u;
  let h = i32(o / {T}u);
  let t = i32(o % {T}u);
  let g = h / {group};
  let pos = start + t;
  let trow = {dims.table_row("pos")};
  let row = i32(o) * {width};
  if (live) {{
    for (var d: i32 = tid; d < {hd}; d = d + {WORKGROUP}) {{
      qs[d] = {dims.rotated("in0", f"t * {heads * hd} + h * {hd}", "trow", "in6", "in7")} * {float(scale)!r};
    }}
  }}
  if (live && h % {group} == 0) {{  // the group's first head leaves its rotated key row for the append
    for (var d: i32 = tid; d < {hd}; d = d + {WORKGROUP}) {{
      out1[{dims.scores} + (t * {kv} + g) * {hd} + d] = {dims.rotated("in1", f"t * {kv * hd} + g * {hd}", "trow", "in6", "in7")};
    }}
  }}
  workgroupBarrier();
  let lo = {lo};
  let n_cache = max(min(start, {cells}) - lo, 0);
  let t0 = {first_new};
  let n = n_cache + t - t0 + 1;
  var m = e_bits(0xff800000u);
  if (live) {{
    for (var i: i32 = tid; i < n; i = i + {WORKGROUP}) {{
      var dot = 0.0;
      if (i < n_cache) {{
        let c = lo + i;
        for (var d: i32 = 0; d < {hd}; d = d + 1) {{ dot = dot + qs[d] * in3[{dims.key_at("c")}]; }}
      }} else {{
        let tn = t0 + i - n_cache;
        let krow = {dims.table_row("start + tn")};
        for (var d: i32 = 0; d < {hd}; d = d + 1) {{
          dot = dot + qs[d] * {dims.rotated("in1", f"tn * {kv * hd} + g * {hd}", "krow", "in6", "in7")};
        }}
      }}
      let s0 = dot;
      let score = {soft};
      out1[row + i] = score;
      m = e_max(m, score);
    }}
  }}
  red[tid] = m;
  workgroupBarrier();
  for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{
    if (tid < half) {{ red[tid] = e_max(red[tid], red[tid + half]); }}
    workgroupBarrier();
  }}
  let mx = red[0];
  workgroupBarrier();
  var part = 0.0;
  if (live) {{
    for (var i: i32 = tid; i < n; i = i + {WORKGROUP}) {{ part = part + exp(out1[row + i] - mx); }}
  }}
  red[tid] = part;
  workgroupBarrier();
  for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{
    if (tid < half) {{ red[tid] = red[tid] + red[tid + half]; }}
    workgroupBarrier();
  }}
  let total = red[0];
  if (live) {{
    for (var i: i32 = tid; i < n; i = i + {WORKGROUP}) {{ out1[row + i] = exp(out1[row + i] - mx) / total; }}
  }}
  storageBarrier();
  workgroupBarrier();
  if (live) {{
    for (var dd: i32 = tid; dd < {hd}; dd = dd + {WORKGROUP}) {{
      var acc = 0.0;
      for (var i: i32 = 0; i < n_cache; i = i + 1) {{
        acc = acc + out1[row + i] * in4[{dims.value_at("lo + i", "dd")}];
      }}
      for (var i: i32 = n_cache; i < n; i = i + 1) {{
        acc = acc + out1[row + i] * in2[(t0 + i - n_cache) * {kv * hd} + g * {hd} + dd];
      }}
      out0[t * {heads * hd} + h * {hd} + dd] = acc;
    }}
  }}
}}
"""
    scratch = scratch_of(node)  # a value of the partition's own, planned in the arena like any other
    graph.specs[scratch] = TensorSpec((dims.scores + T * kv * hd,), DType.float32)
    decls = [f"@group(0) @binding({j}) var<storage, read_write> in{j}: array<{STORAGE_TYPE[graph.specs[x].dtype]}>;"
             for j, x in enumerate(inputs)]
    decls += [f"@group(0) @binding({len(inputs)}) var<storage, read_write> out0: array<f32>;",
              f"@group(0) @binding({len(inputs) + 1}) var<storage, read_write> out1: array<f32>;",
              f"var<workgroup> qs: array<f32, {hd}>;", f"var<workgroup> red: array<f32, {WORKGROUP}>;"]
    source = PRELUDE + "\n".join(decls) + body
    values = [*(alias.get(x, x) for x in inputs), alias.get(node.outputs[0], node.outputs[0]), scratch]
    return Kernel(source, values, rows * WORKGROUP, [node.name], label="cache_attention:workgroup", n_outputs=2)
