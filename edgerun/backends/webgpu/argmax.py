"""argmax / argmin over a long axis (a decoder's logits) as a GPU reduction: one workgroup per output."""

from __future__ import annotations

import math

from edgerun.backends.webgpu.wgsl import STORAGE_TYPE, WGSL_TYPE, WORKGROUP, Kernel, coords, row_major
from edgerun.ir.graph import Graph, Node

WIDE_ARG = 1024  # an argmax/argmin over at least this many elements per output gets a workgroup per output


def is_wide_arg(node: Node, graph: Graph) -> bool:
    if node.op not in ("argmax", "argmin"):
        return False
    x = graph.specs[node.inputs[0]]
    return x.shape[int(node.attrs.get("axis", 0)) % max(x.rank, 1)] >= WIDE_ARG


def wide_arg_kernel(node: Node, graph: Graph) -> Kernel:
    """argmax/argmin of a long axis (a decoder's logits): one workgroup per output, each thread scans a
    strided share, then a tree reduction in workgroup memory. Ties keep the lower index (the higher with
    select_last_index), so the answer equals the one-thread scan's and the reference's."""
    x = graph.specs[node.inputs[0]]
    axis = int(node.attrs.get("axis", 0)) % max(x.rank, 1)
    strides = row_major(x.shape)
    kept = [a for a in range(x.rank) if a != axis]
    outputs = math.prod(x.shape[a] for a in kept)
    length, step = x.shape[axis], strides[axis]
    better = ">" if node.op == "argmax" else "<"
    tie = ">" if node.attrs.get("select_last_index") else "<"
    t = STORAGE_TYPE[x.dtype]
    load = f"f32(in0[base + r * {step}])" if t == "f16" else f"in0[base + r * {step}]"
    base = " + ".join(f"k{i} * {strides[a]}" for i, a in enumerate(kept)) or "0"
    vt = "f32" if t == "f16" else WGSL_TYPE[x.dtype]
    lines = coords([x.shape[a] for a in kept], var="o", prefix="k")
    enable = "enable f16;\n" if t == "f16" else ""
    source = f"""{enable}@group(0) @binding(0) var<storage, read_write> in0: array<{t}>;
@group(0) @binding(1) var<storage, read_write> out0: array<i32>;
var<workgroup> best_v: array<{vt}, {WORKGROUP}>;
var<workgroup> best_i: array<i32, {WORKGROUP}>;
fn wins(v: {vt}, i: i32, w: {vt}, j: i32) -> bool {{
  if (j < 0) {{ return i >= 0; }}
  if (i < 0) {{ return false; }}
  return v {better} w || (v == w && i {tie} j);
}}
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let o = wid.x + wid.y * nwg.x;
  let tid = i32(lid.x);
  var bv: {vt};
  var bi: i32 = -1;
  if (o < {outputs}u) {{
    {chr(10).join('    ' + line for line in lines).strip()}
    let base = {base};
    for (var r: i32 = tid; r < {length}; r = r + {WORKGROUP}) {{
      let v = {load};
      if (wins(v, r, bv, bi)) {{ bv = v; bi = r; }}
    }}
  }}
  best_v[tid] = bv;
  best_i[tid] = bi;
  workgroupBarrier();
  for (var half: i32 = {WORKGROUP // 2}; half > 0; half = half / 2) {{
    if (tid < half && wins(best_v[tid + half], best_i[tid + half], best_v[tid], best_i[tid])) {{
      best_v[tid] = best_v[tid + half];
      best_i[tid] = best_i[tid + half];
    }}
    workgroupBarrier();
  }}
  if (tid == 0 && o < {outputs}u) {{ out0[o] = best_i[0]; }}
}}
"""
    return Kernel(source, [node.inputs[0], node.outputs[0]], outputs * WORKGROUP, [node.name],
                  label=f"{node.op}:workgroup")
