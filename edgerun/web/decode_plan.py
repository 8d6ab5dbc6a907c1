"""The decode and prefill steps as plans a browser replays: WGSL shaders, bindings into two buffers, and
per-call writes.

The plan is what the webgpu backend's capture records for one decode call, written down: the decode program
(one token against the KV cache, then a GPU argmax over the logits) is loaded on `webgpu` through the normal
runtime, and its one partition's dispatch list — shader, bound ranges, workgroup counts — becomes JSON.
Everything lives in two device buffers: the arena (inputs, intermediates, outputs, and the KV cache, held
across calls with `PartitionRunner.hold`) and the weights (the constants blob, as the backend stores it).

The cache is the program's state, as `edgerun.llm` runs it: each layer's `cache_attention` is one dispatch
(backends/webgpu/attention.py), and its new key and value rows are written at the run-time position `start`
in place in the cache's range by two small parts riding in the output projection's dispatch, so the appends
need no dispatch of their own. A token is three
4-byte writes (token, start, last), the recorded dispatches, and a 4-byte read of the next token.

The prefill plan is the same step at a chunk of tokens (`step_program(chunk=...)`), captured the same way:
a prompt runs in ceil(L / chunk) replays instead of L. It has an arena of its own (its cache ranges differ
from the decode plan's: the runtime copies them over after the prompt) and shares the weights blob: each of
its constants that the decode plan holds under the same name with the same bytes binds the decode plan's
range, the rest (its causal mask) are appended (`build_plan(shared=...)`).

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
from edgerun.backends.webgpu.wgsl import Kernel
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph, Node
from edgerun.llm.architecture import Architecture
from edgerun.llm.checkpoint import Checkpoint
from edgerun.llm.model import ModelInfo
from edgerun.llm.program_builder import PROJECTIONS, cache_specs, step_graph
from edgerun.llm.quant_blocks import GROUP, PackedWeight
from edgerun.program import Program

PLAN_FORMAT, PLAN_VERSION = "edgerun-web-plan", 1
# Storage buffers one dispatch of the plan may bind: what Chromium's SwiftShader adapter offers (WebGPU's
# default is 8; Chromium reports 10 where the hardware allows), so merged dispatches stay portable.
WEB_MAX_BINDINGS = 10
STEP_INPUTS = ("tokens", "start", "last")


def decode_program(checkpoint: Checkpoint, info: ModelInfo, int4: bool = True, chunk: int = 1) -> Program:
    """The LLM package's step (its step builder at `chunk` tokens: 1 decodes, more prefill; the KV cache as
    state) with a GPU argmax of the `last` row's logits as its output ("next_token") instead of the logits,
    and (int4) the GGUF's packed 4-bit projections as matmul_int4."""
    graph = step_graph(info.config, float_weights(checkpoint), chunk=chunk, context=info.context)
    if int4:
        _pack_projections(graph, checkpoint)
    logits = graph.outputs[0]
    graph.outputs = [Builder(graph).emit("argmax", [logits], axis=0, keepdims=True)]
    graph.prune_specs()
    return step_program(graph, info.config, info.context)


def step_program(graph: Graph, config: Architecture, context: int) -> Program:
    """A step graph (its KV cache is state) as a one-method program, the cache zeroed."""
    state = {name: np.zeros(spec.shape, np.float32) for name, spec in cache_specs(config, context).items()}
    return Program.from_methods({"decode": graph}, default_method="decode", state=state)


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
    const_range: dict[str, tuple[int, int]]  # constant -> (offset, bytes) in `weights`
    cache_range: dict[str, tuple[int, int]]  # KV cache -> (offset, bytes) in the arena


def build_plan(source: Program, config: Architecture, context: int, align: int = 256,
               shared: WebPlan | None = None) -> WebPlan:
    """Load `source` (from decode_program) on webgpu and write its dispatch list down as a plan, every bound
    range aligned to `align` bytes. With `shared` (the decode plan, for the prefill plan), the weights are
    `shared`'s blob with this plan's other constants appended (see the module doc)."""
    from edgerun.runtime import load

    program = load(source, backends=["webgpu"])
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
    runner.hold(caches, align=align)  # the cache lives in the arena from token to token
    appends = [(n.inputs[j], n.outputs[j - 2]) for n in sub.nodes if n.op == "cache_attention" for j in (3, 4)]
    if len(appends) != len(caches) or any(runner.value_range(updated) != runner.value_range(cache)
                                          for cache, updated in appends):
        raise EdgerunError("the decode program's KV-cache appends do not all run in place on webgpu; the "
                           "browser plan keeps the cache in the arena and needs them to")
    weights, const_range = pack_constants(sub, runner.constants, runner.align)
    if shared is not None:
        weights, const_range = _share_weights(weights, const_range, shared, runner.align)
    shaders: dict[str, int] = {}
    params: list[list[int]] = []
    dispatches = []
    for kernel in runner.kernels:
        dispatches.append(_dispatch(kernel, runner, const_range, shaders, params))
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
        "sections": section_counts(dispatch_sections(runner.kernels), config.layers),
    }
    return WebPlan(plan, weights, const_range, {v: runner.value_range(v) for v in caches})


def _share_weights(weights: np.ndarray, const_range: dict[str, tuple[int, int]], base: WebPlan,
                   align: int) -> tuple[np.ndarray, dict[str, tuple[int, int]]]:
    """`base`'s blob, with each constant of `weights` that `base` does not hold (same name, same bytes)
    appended; the ranges of all of `const_range` in it."""
    ranges: dict[str, tuple[int, int]] = {}
    extra: list[tuple[int, np.ndarray]] = []
    end = base.weights.nbytes
    for name, (offset, size) in const_range.items():
        data = weights[offset:offset + size]
        held = base.const_range.get(name)
        if held is not None and held[1] == size and np.array_equal(base.weights[held[0]:held[0] + size], data):
            ranges[name] = held
            continue
        end = -(-end // align) * align
        extra.append((end, data))
        ranges[name] = (end, size)
        end += size
    blob = np.zeros(max(end, 4), np.uint8)
    blob[:base.weights.nbytes] = base.weights
    for offset, data in extra:
        blob[offset:offset + data.nbytes] = data
    return blob, ranges


def with_prefill(decode: WebPlan, prefill: WebPlan, chunk: int) -> WebPlan:
    """The decode plan with the prefill plan inside ("prefill": its dispatches, shaders, inputs, chunk, and
    the cache ranges to copy into the decode arena after a prompt); the weights are the prefill's (the
    decode blob with the prefill's own constants appended)."""
    if any(prefill.cache_range[name][1] != size for name, (_, size) in decode.cache_range.items()):
        raise EdgerunError("the prefill and decode plans hold KV caches of different sizes")
    copies = [[name, prefill.cache_range[name][0], offset, size] for name, (offset, size) in
              decode.cache_range.items()]
    inner = {k: v for k, v in prefill.plan.items() if k not in ("format", "version", "weights_bytes")}
    plan = {**decode.plan, "weights_bytes": int(prefill.weights.nbytes),
            "prefill": {**inner, "chunk": chunk, "caches": copies}}
    plan["max_bindings"] = max(decode.plan["max_bindings"], prefill.plan["max_bindings"])
    plan["max_binding_bytes"] = max(decode.plan["max_binding_bytes"], prefill.plan["max_binding_bytes"])
    return WebPlan(plan, prefill.weights, prefill.const_range, decode.cache_range)


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


def dispatch_sections(kernels: list[Kernel]) -> list[str]:
    """Each dispatch's place in the step, the way zerotvm counts dispatches per token: "preamble" (before the
    first layer: the embedding), "layer i" (from the first dispatch reading one of layer i's weights to the
    next layer's), "tail" (from the final norm on: logits, argmax)."""
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
