"""The decode step as a plan a browser replays: WGSL shaders, bindings into two buffers, and per-token writes.

The plan is what the webgpu backend's capture records for one decode call, written down: the decode program
(one token against the KV cache, then a GPU argmax over the logits) is loaded on `webgpu` through the normal
runtime, and its one partition's dispatch list — shader, bound ranges, workgroup counts — becomes JSON.
Everything lives in two device buffers: the arena (inputs, intermediates, outputs, and the KV cache, held
across calls with `PartitionRunner.hold`) and the weights (the constants blob, as the backend stores it).

The static programs pass the cache in and the new rows out (the LLM package's interface until the IR has
state), so the plan adds one dispatch of its own, the KV append: it copies every layer's new key and value
row into its cache range at position `start`. A token is then three 4-byte writes (token, start, last),
the recorded dispatches plus the append, and a 4-byte read of the next token.

Projection weights that the GGUF stores as Q4_0 or Q4_1 stay packed: their matmuls become `matmul_int4`
(groups of 32, scale per group). Q4_0 (value = d*(q-8)) maps exactly; Q4_1 (value = d*q + m) becomes the
float zero point -m/d, which rounds once more than the CPU path's exact dequantization.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.backends.webgpu.runner import PartitionRunner, pack_constants
from edgerun.backends.webgpu.wgsl import WORKGROUP, Kernel
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph, Node
from edgerun.llm.architecture import LlamaArchitecture
from edgerun.llm.checkpoint import Checkpoint
from edgerun.llm.model import ModelInfo
from edgerun.llm.program_builder import PROJECTIONS, step_graph
from edgerun.llm.quant_blocks import GROUP, PackedWeight

PLAN_FORMAT, PLAN_VERSION = "edgerun-web-plan", 1
# Storage buffers one dispatch of the plan may bind: what Chromium's SwiftShader adapter offers (WebGPU's
# default is 8; Chromium reports 10 where the hardware allows), so merged dispatches stay portable.
WEB_MAX_BINDINGS = 10
STEP_INPUTS = ("tokens", "start", "last")


def decode_graph(checkpoint: Checkpoint, info: ModelInfo, int4: bool = True) -> Graph:
    """The LLM package's decode step (its step builder at one token) with a GPU argmax as its first output
    ("next_token") instead of the logits, and (int4) the GGUF's packed 4-bit projections as matmul_int4."""
    graph = step_graph(info.config, float_weights(checkpoint), chunk=1, context=info.context)
    if int4:
        _pack_projections(graph, checkpoint)
    logits = graph.outputs[0]
    token = Builder(graph).emit("argmax", [logits], axis=0, keepdims=True)
    graph.outputs = [token, *graph.outputs[1:]]
    graph.prune_specs()
    return graph


def float_weights(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """Every weight as float32, projections as the [in, out] `.T` arrays the step builder reads; the packed
    ones are swapped back in by `_pack_projections`, so the plan does not depend on how the LLM package
    chooses to pack."""
    weights = {}
    for n in checkpoint.weights:
        if n.rsplit(".", 1)[-1] in PROJECTIONS:
            weights[n + ".T"] = np.ascontiguousarray(checkpoint.float_weight(n).T)
        else:
            weights[n] = checkpoint.float_weight(n)
    return weights


def _pack_projections(graph: Graph, checkpoint: Checkpoint) -> None:
    for k, node in enumerate(graph.nodes):
        weight = node.inputs[1] if node.op == "matmul" else ""
        name = weight[:-2] if weight.endswith(".T") else ""
        packed = checkpoint.weights.get(name) if name.rsplit(".", 1)[-1] in PROJECTIONS else None
        if not isinstance(packed, PackedWeight) or packed.bits != 4 or weight not in graph.constants:
            continue
        n, kdim = packed.shape
        blocks = kdim // GROUP
        ins = [node.inputs[0], graph.add_constant(packed.data.reshape(n, blocks, GROUP // 2), name=name + ".q4"),
               graph.add_constant(packed.scales, name=name + ".scales")]
        if packed.scheme == "q4_1":
            assert packed.mins is not None
            with np.errstate(divide="ignore", invalid="ignore"):
                zero = np.where(packed.scales != 0, -packed.mins / packed.scales, 0.0).astype(np.float32)
            ins.append(graph.add_constant(zero, name=name + ".zero"))
        graph.nodes[k] = Node("matmul_int4", ins, list(node.outputs), {"k": kdim, "n": n, "group_size": GROUP},
                              dict(node.meta), node.name)
        del graph.constants[weight]


@dataclass
class WebPlan:
    plan: dict[str, Any]  # JSON
    weights: np.ndarray  # uint8: the constants blob the "w" bindings point into


def build_plan(graph: Graph, config: LlamaArchitecture, context: int, align: int = 256) -> WebPlan:
    """Load `graph` (from decode_graph) on webgpu and write its dispatch list down as a plan, every bound range
    aligned to `align` bytes."""
    from edgerun.runtime import load

    program = load(graph, backends=["webgpu"])
    parts = program.parts
    if len(parts.partitions) != 1 or parts.partitions[0].backend != "webgpu":
        placed = sorted({(n.op, p.backend) for p in parts.partitions if p.backend != "webgpu" for n in p.nodes})
        raise EdgerunError(f"the decode program does not run whole on webgpu (elsewhere: {placed[:8]}); the "
                           "browser runtime replays a single webgpu partition")
    runner = parts.compiled[0].info["runner"]
    assert isinstance(runner, PartitionRunner)
    sub = runner.graph
    runner.set_fusion(True, max_bindings=WEB_MAX_BINDINGS)
    caches = [v for v in sub.inputs if v.startswith(("k_cache_", "v_cache_"))]
    runner.hold([*caches, "start"], align=align)  # the KV append reads start after every other dispatch
    weights, const_range = pack_constants(sub, runner.constants, runner.align)
    shaders: dict[str, int] = {}
    params: list[list[int]] = []
    dispatches = []
    for kernel in runner.kernels:
        dispatches.append(_dispatch(kernel, runner, const_range, shaders, params))
    dispatches.append(_kv_append(runner, config, context, shaders, params))
    token = program.graph.outputs[0]  # the partition lists its outputs in its own order
    _check_no_aliasing(dispatches)
    plan = {
        "format": PLAN_FORMAT, "version": PLAN_VERSION,
        "arena_bytes": runner.arena_bytes, "weights_bytes": int(weights.nbytes),
        "shaders": list(shaders), "params": params, "dispatches": dispatches,
        "inputs": {v: runner.value_range(v)[0] for v in STEP_INPUTS},
        "next_token": runner.value_range(token)[0],
        "max_bindings": max(len(d["bind"]) for d in dispatches),
        "max_binding_bytes": max(size for d in dispatches for _, _, size in d["bind"]),
        "sections": section_counts([*dispatch_sections(runner.kernels), "tail"], config.layers),
    }
    return WebPlan(plan, weights)


def _dispatch(kernel: Kernel, runner: PartitionRunner, const_range: dict[str, tuple[int, int]],
              shaders: dict[str, int], params: list[list[int]]) -> dict[str, Any]:
    bind: list[tuple[str, int, int]] = []
    for v in kernel.values:
        if v in const_range:
            bind.append(("w", *const_range[v]))
        else:
            bind.append(("a", *runner.value_range(v)))
    if kernel.status:
        bind.append(("s", 0, 4))
    if kernel.params is not None:
        params.append([int(x) for x in kernel.params])
        bind.append((f"p{len(params) - 1}", 0, 4 * len(kernel.params)))
    x, y = runner.workgroups(kernel.threads)
    return {"shader": shaders.setdefault(kernel.source, len(shaders)), "bind": bind, "groups": [x, y],
            "label": kernel.label}


def _kv_append(runner: PartitionRunner, config: LlamaArchitecture, context: int, shaders: dict[str, int],
               params: list[list[int]]) -> dict[str, Any]:
    """One dispatch writing every layer's new K row ([kv, hd, 1] into [kv, hd, C]) and V row ([kv, 1, hd]
    into [kv, C, hd]) at column/row `start`, read from the arena; the arena is bound whole as words."""
    row = config.kv_heads * config.head_dim
    table = [runner.value_range("start")[0] // 4]
    for i in range(config.layers):
        for kind in ("k", "v"):
            table += [runner.value_range(f"{kind}_cache_{i}")[0] // 4, runner.value_range(f"{kind}_new_{i}")[0] // 4,
                      int(kind == "v")]
    entries = 2 * config.layers
    hd, c = config.head_dim, context
    source = f"""@group(0) @binding(0) var<storage, read_write> arena: array<u32>;
@group(0) @binding(1) var<storage, read_write> params: array<i32>;
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let idx = gid.x + gid.y * nwg.x * {WORKGROUP}u;
  if (idx >= {entries * row}u) {{ return; }}
  let e = i32(idx / {row}u);
  let j = i32(idx % {row}u);
  let start = i32(arena[params[0]]);
  let cache = params[1 + 3 * e];
  let fresh = params[2 + 3 * e];
  let h = j / {hd};
  let d = j % {hd};
  var at = cache + (h * {hd} + d) * {c} + start;
  if (params[3 + 3 * e] == 1) {{ at = cache + (h * {c} + start) * {hd} + d; }}
  arena[at] = arena[fresh + j];
}}
"""
    params.append(table)
    x, y = runner.workgroups(entries * row)
    return {"shader": shaders.setdefault(source, len(shaders)),
            "bind": [("a", 0, runner.arena_bytes), (f"p{len(params) - 1}", 0, 4 * len(table))],
            "groups": [x, y], "label": "kv_append"}


def dispatch_sections(kernels: list[Kernel]) -> list[str]:
    """Each dispatch's place in the step, the way zerotvm counts dispatches per token: "preamble" (before the
    first layer: embedding, RoPE tables, masks), "layer i" (from the first dispatch reading one of layer i's
    weights to the next layer's), "tail" (from the final norm on: logits, argmax, KV append)."""
    sections, current = [], "preamble"
    for kernel in kernels:
        for v in kernel.values:
            if v.startswith("layers."):
                current = f"layer {int(v.split('.')[1])}"
            elif v in ("final_norm", "lm_head"):
                current = "tail"
        sections.append(current)
    return sections


def section_counts(sections: list[str], layers: int) -> dict[str, Any]:
    per_layer = [sections.count(f"layer {i}") for i in range(layers)]
    return {"preamble": sections.count("preamble"), "per_layer": per_layer, "layers": sum(per_layer),
            "tail": sections.count("tail"), "total": len(sections)}


def _check_no_aliasing(dispatches: list[dict[str, Any]]) -> None:
    """Browsers refuse a dispatch whose writable bindings overlap in one buffer; every binding here is
    read_write, so no two ranges of a dispatch may overlap."""
    for d in dispatches:
        spans = sorted((buf, off, off + size) for buf, off, size in d["bind"])
        for (b1, _, end), (b2, start, _) in itertools.pairwise(spans):
            if b1 == b2 and start < end:
                raise EdgerunError(f"dispatch {d['label']} binds overlapping ranges of buffer {b1!r}")
