"""A partition becomes a list of dispatches; with fusion, whole chains of nodes ride in one dispatch.

Fusion is the backend's own pass over the partition: a node with a per-output-element kernel (elementwise,
matmul, conv, pooling, reduction, gather) anchors a group, and each later elementwise node that reads the
group's values over its output shape joins it as epilogue code (also a group up to LOOK_BACK behind the
latest, when what else it reads exists before it). A matmul of the anchor's kind and shape whose operands
the group does not compute joins as a sibling (computed by the same thread). So matmul + bias +
activation, conv + bias + ReLU, gate + up + SiLU, elementwise chains (GELU's seven ops, softmax's sub+exp)
each become one dispatch, and the intermediates never touch memory. Then neighbouring groups where the
later reads nothing the earlier write are merged into one dispatch (horizontal fusion), within a cap on
bindings. Rasters that copy a value whole take no dispatch (identity_rasters); rasters read by one kernel
are computed in it (inline.py); an RMSNorm read only by matmuls is computed in their prologue (prologue.py);
a KV-cache append (update_slice) writes its rows in place and shares its neighbours' dispatch (update.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from edgerun.backends.webgpu.argmax import is_wide_arg, wide_arg_kernel
from edgerun.backends.webgpu.attention import Append, append_parts, cache_attention_kernels
from edgerun.backends.webgpu.inline import InlineWriter, inline_values, replace_inline_loads
from edgerun.backends.webgpu.int8 import int8_kernels, is_int8_node
from edgerun.backends.webgpu.prologue import MATMULS, fold_norm, foldable_norms
from edgerun.backends.webgpu.raster import raster_kernels
from edgerun.backends.webgpu.update import in_place_updates, storage_types, update_lines
from edgerun.backends.webgpu.wgsl import (
    ELEMENTWISE,
    STORAGE_TYPE,
    Body,
    Kernel,
    broadcast_strides,
    coords,
    elementwise_expr,
    node_body,
    offset_expr,
    shader_source,
)
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import regions_of


@dataclass
class Group:
    anchor: Node
    chain: list[Node] = field(default_factory=list)
    siblings: list[Node] = field(default_factory=list)  # matmuls of the anchor's input, computed alongside

    @property
    def values(self) -> set[str]:
        return {self.anchor.outputs[0], *(n.outputs[0] for n in (*self.siblings, *self.chain))}


def _sibling(node: Node, group: Group, graph: Graph) -> bool:
    """A matmul of the anchor's kind and output shape whose inputs the group does not compute (checked by
    the caller): one thread computes both dot products, so a decoder's gate + up + SiLU + mul is one
    dispatch."""
    a = group.anchor
    out = graph.specs[node.outputs[0]]
    return (node.op == a.op and node.op in MATMULS and node.attrs == a.attrs and out.dtype is DType.float32
            and out.shape == graph.specs[a.outputs[0]].shape)


def identity_rasters(graph: Graph) -> dict[str, str]:
    """Rasters that copy a whole value unchanged (a reshape, or a transpose of a size-1 axis as in a decoder's
    [1, heads, hd] -> [heads, 1, hd]): output -> source. They cost no dispatch; the output shares the
    source's device range. Constant sources keep their copy (their range is in the constant buffer)."""
    alias: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "raster" or node.attrs.get("fill") is not None:
            continue
        regions = regions_of(node.attrs)
        src, out = node.inputs[0], node.outputs[0]
        numel = graph.specs[out].numel
        if len(regions) != 1 or src in graph.constants or graph.specs[src].numel != numel:
            continue
        if regions[0].is_identity(numel):
            alias[out] = alias.get(src, src)
    return alias


def value_aliases(graph: Graph) -> dict[str, str]:
    """Value -> the value whose device range it shares: identity rasters' outputs and in-place updates'."""
    alias = identity_rasters(graph)
    return {**alias, **in_place_updates(graph, alias)}


LOOK_BACK = 4  # groups an elementwise node may join behind the latest one (RoPE's q scale after RoPE k)


def lower(graph: Graph, fuse: bool = True, max_bindings: int = 8, int4_half: bool = False,
          fold_norms: bool = True) -> list[Kernel]:
    """The dispatch list of `graph` (a partition with atomic ops and rasters only), in execution order. With
    fusion, identity rasters take no dispatch (`identity_rasters`): kernels bind their sources instead, and
    independent neighbouring groups share one dispatch when their bindings fit in `max_bindings`.
    `int4_half`: matmul_int4 accumulates in f16 (only on adapters with shader-f16). `fold_norms`: RMSNorms
    read only by matmuls run in their prologue (one dispatch fewer each, K more loads per matmul thread)."""
    alias = value_aliases(graph) if fuse else {}
    readers: Counter[str] = Counter(alias.get(v, v) for n in graph.nodes for v in n.inputs if v)
    outputs = {alias.get(v, v) for v in graph.outputs}
    inline = inline_values(graph, alias, outputs) if fuse else {}
    folded = foldable_norms(graph, alias, outputs) if fuse and fold_norms else {}
    # cache_attention (attention.py) loads its operands from memory: one computed where it is read (an inline
    # raster, a folded norm) would never be stored, so those are computed by a dispatch of their own.
    bound = {u for n in graph.nodes if n.op == "cache_attention" for v in n.inputs if v for u in (v, alias.get(v, v))}
    inline = {v: n for v, n in inline.items() if v not in bound}
    folded = {v: n for v, n in folded.items() if v not in bound}
    groups: list[Group | Node] = []
    made_by: dict[str, int] = {}  # value -> index in `groups` of what computes it

    def made_before(v: str, at: int) -> bool:
        return made_by.get(alias.get(v, v), -1) < at

    # In-place updates (update.py) and cache_attention's appends: (the range written, the values read, the
    # kernel part), each placed in a dispatch below.
    floating: list[tuple[str, set[str], Parts]] = []
    for node in graph.nodes:
        if node.op == "update_slice" and node.outputs[0] in alias:
            reads = {alias.get(v, v) for v in node.inputs[1:3]}
            floating.append((alias[node.outputs[0]], reads, _update_parts(node, graph, alias)))
            continue
        if node.op == "cache_attention":
            groups.append(node)
            made_by.update((v, len(groups) - 1) for v in node.outputs)
            floating += [(a.written, set(a.bound), _append_parts(a, node)) for a in append_parts(node, graph, alias)]
            continue
        if node.outputs[0] in alias or node.outputs[0] in inline or node.outputs[0] in folded:
            continue
        target = _group_to_join(node, groups, graph, {**inline, **folded}, made_before) if fuse else None
        if target is not None:
            made_by[node.outputs[0]] = target
            continue
        if node.op == "raster" or is_int8_node(node, graph) or is_wide_arg(node, graph):
            groups.append(node)
        else:
            groups.append(Group(node))
        made_by.update((v, len(groups) - 1) for v in node.outputs)
    built: list[Parts | list[Kernel]] = []
    for g in groups:
        if isinstance(g, Node):
            if g.op == "cache_attention":
                node_kernels = cache_attention_kernels(g, graph, alias)
            elif is_int8_node(g, graph):
                node_kernels = int8_kernels(g, graph)
            else:
                node_kernels = [wide_arg_kernel(g, graph)] if g.op != "raster" else raster_kernels(g, graph)
            for k in node_kernels:
                k.values = [alias.get(v, v) for v in k.values]
            built.append(node_kernels)
        else:
            built.append(group_parts(g, graph, readers, outputs, alias, inline, folded, int4_half))
    updates = [(_last_dependency(root, reads, built), parts) for root, reads, parts in floating]
    kernels: list[Kernel] = []
    pending: list[Parts] = []

    def flush(done: int) -> None:
        """Emit the pending dispatch; groups up to `done` are then all emitted, so the updates that follow
        only them start the next dispatch."""
        nonlocal pending
        kernels.extend([merge(pending)] if pending else [])
        pending = []
        for dep, parts in [u for u in updates if u[0] <= done]:
            updates.remove((dep, parts))
            if pending and not _independent(pending, parts, max_bindings):
                kernels.append(merge(pending))
                pending = []
            pending.append(parts)

    floating_parts = {id(parts) for _, parts in updates}

    def defer_updates(i: int, item: Parts) -> None:
        """Updates waiting for a dispatch (all of `pending`): those that fit ride with `item`, the others
        wait for the next dispatch (nothing after their last dependency touches their range), so a binding
        cap does not cost an update a dispatch of its own."""
        nonlocal pending
        if not pending or not all(id(p) in floating_parts for p in pending) \
                or _independent(pending, item, max_bindings):
            return
        keep: list[Parts] = []
        for p in pending:
            if _independent([*keep, p], item, max_bindings):
                keep.append(p)
            else:
                updates.append((i - 1, p))
        pending = keep

    for i, item in enumerate(built):
        if isinstance(item, list):
            flush(i - 1)
            kernels.extend(item)
            flush(i)
            continue
        defer_updates(i, item)
        if pending and not (fuse and _independent(pending, item, max_bindings)):
            flush(i - 1)
            defer_updates(i, item)
            if pending and not _independent(pending, item, max_bindings):
                flush(i - 1)
        pending.append(item)
    flush(len(built))
    kernels.extend([merge(pending)] if pending else [])  # updates that follow the last dispatch
    return kernels


def _last_dependency(root: str, inputs: set[str], built: list[Parts | list[Kernel]]) -> int:
    """The index of the last dispatch item an in-place update must follow: the last that binds the range it
    writes, `root` (its cache's readers), or stores what it reads, `inputs` (its rows, start)."""
    last = -1
    for i, item in enumerate(built):
        touched = {v for k in item for v in k.values} if isinstance(item, list) else {*item.bound, *item.stored}
        written = ({v for k in item for v in k.values[len(k.values) - k.n_outputs:]} if isinstance(item, list)
                   else set(item.stored))  # a kernel writes its last n_outputs values
        if root in touched or written & inputs:
            last = i
    return last


def _group_to_join(node: Node, groups: list[Group | Node], graph: Graph, computed: dict[str, Node],
                   made_before: Callable[[str, int], bool]) -> int | None:
    """The index of the group `node` rides in: as epilogue code (an elementwise node reading the group's
    values) or as a sibling (a matmul beside the latest group's anchor matmul). A group behind the latest
    one qualifies when everything else the node reads is computed before that group (its dispatch runs
    earlier than the node's place in the order). `computed`: values computed where they are read (inline
    rasters, folded norms), whose own inputs are what the node really reads from memory."""
    for at in range(len(groups) - 1, max(len(groups) - 1 - LOOK_BACK, -1), -1):
        group = groups[at]
        if not isinstance(group, Group):
            continue
        memory = _memory_inputs([v for v in node.inputs if v], computed)
        if not all(v in group.values or made_before(v, at) for v in memory):
            continue
        if _joins(node, group, graph, computed):
            group.chain.append(node)
            return at
        if at == len(groups) - 1 and not memory & group.values and _sibling(node, group, graph):
            group.siblings.append(node)
            return at
    return None


def _independent(pending: list[Parts], parts: Parts, max_bindings: int) -> bool:
    """Whether `parts` can share a dispatch with `pending` (horizontal fusion): it reads nothing they write,
    and writes nothing they read (an in-place update's range), and the merged kernel binds at most
    `max_bindings` buffers (the status word counts once)."""
    written = {v for p in pending for v in p.stored}
    if written & set(parts.bound) or set(parts.stored) & {v for p in pending for v in p.bound}:
        return False
    merged = (*pending, parts)
    bound = {v for p in merged for v in p.bound}
    status = any(p.status for p in merged)
    return len(bound) + sum(len(p.stored) for p in merged) + status <= max_bindings


def _joins(node: Node, group: Group, graph: Graph, inline: dict[str, Node]) -> bool:
    """An elementwise node reading one of the group's values (or an inline raster), over the group's output
    shape. Groups are contiguous in the topological order, so every reader outside a group runs after its
    dispatch; an inline value must not read the group's own values from memory (they are stored by this
    very dispatch)."""
    shape = graph.specs[group.anchor.outputs[0]].shape
    if node.op not in ELEMENTWISE or graph.specs[node.outputs[0]].shape != shape:
        return False
    reads_inline = [v for v in node.inputs if v in inline]
    if reads_inline and _memory_inputs(reads_inline, inline) & group.values:
        return False
    return any(v in group.values for v in node.inputs) or bool(reads_inline)


def _memory_inputs(values: list[str], inline: dict[str, Node]) -> set[str]:
    """The values read from memory to compute `values` (through the inline ones' inputs)."""
    found: set[str] = set()
    todo = list(values)
    while todo:
        v = todo.pop()
        if v in inline:
            todo += [u for u in inline[v].inputs if u]
        else:
            found.add(v)
    return found


@dataclass
class Parts:
    """One group's kernel before it becomes a shader: loads in{k} of `bound[k]`, stores out{j} of
    `stored[j]`, at flat index `idx` < `threads`; `merge` makes one dispatch of one or more."""

    bound: list[str]
    stored: list[str]
    lines: list[str]
    helpers: str
    in_types: list[str]
    out_types: list[str]
    threads: int
    nodes: list[str]
    label: str
    status: bool


def group_parts(group: Group, graph: Graph, readers: Counter[str], outputs: set[str], alias: dict[str, str],
                inline: dict[str, Node], folded: dict[str, Node], int4_half: bool = False) -> Parts:
    """The group's kernel; it stores each value read outside the group (or a partition output). Shapes
    come from the values the nodes name; bindings go to their identity-raster sources (`alias`)."""
    body = _body(group.anchor, graph, folded, int4_half)
    bound = list(body.inputs)
    lines = list(body.lines)
    anchor_out = group.anchor.outputs[0]
    shape = graph.specs[anchor_out].shape
    current = {anchor_out: "acc"}
    inside: Counter[str] = Counter()
    for j, sib in enumerate(group.siblings):  # in a block of its own: its lets shadow the anchor's
        extra = _body(sib, graph, folded, int4_half)
        first = len(bound)
        bound += extra.inputs
        shifted = [_shift_loads(line, first) for line in extra.lines]
        lines += [f"var sib{j}: f32;", "{", *shifted, f"sib{j} = acc;", "}"]
        current[sib.outputs[0]] = f"sib{j}"
    if group.chain:
        lines += coords(shape, prefix="e")
    for k, node in enumerate(group.chain):
        args = []
        for v in node.inputs:
            if v in current:
                inside[v] += 1
                args.append(current[v])
                continue
            bound.append(v)
            strides = broadcast_strides(graph.specs[v].shape, shape)
            args.append(f"in{len(bound) - 1}[{offset_expr(strides, prefix='e')}]")
        name = f"acc_e{k}"
        lines.append(f"let {name} = {elementwise_expr(node, graph, args)};")
        current[node.outputs[0]] = name
    helpers = ""
    if any(v in inline for v in bound):
        def load(v: str) -> int:
            bound.append(v)
            return len(bound) - 1
        writer = InlineWriter(graph, inline, load)
        lines = replace_inline_loads(lines, list(bound), writer)
        helpers = "".join(writer.functions.values())
    bound, (lines, helpers) = _bind_once([alias.get(v, v) for v in bound], lines, helpers)
    stored = [v for v in current if v in outputs or readers[v] > inside[v]]
    lines += [f"out{j}[idx] = {current[v]};" for j, v in enumerate(stored)]
    nodes = [group.anchor.name, *(n.name for n in (*group.siblings, *group.chain))]
    label = "+".join(["|".join(n.op for n in (group.anchor, *group.siblings)), *(n.op for n in group.chain)])
    return Parts(bound, stored, lines, helpers, [STORAGE_TYPE[graph.specs[v].dtype] for v in bound],
                 [STORAGE_TYPE[graph.specs[v].dtype] for v in stored], math.prod(shape), nodes, label,
                 status=group.anchor.op in ("gather", "scatter_add"))


def _update_parts(node: Node, graph: Graph, alias: dict[str, str]) -> Parts:
    """An in-place update_slice: its rows stored into its input's range at the run-time start."""
    lines, threads = update_lines(node, graph)
    in_types, out_types = storage_types(node, graph)
    bound = [alias.get(v, v) for v in node.inputs[1:3]]
    return Parts(bound, [alias[node.outputs[0]]], lines, "", in_types, out_types, threads, [node.name],
                 "update_slice", status=False)


def _append_parts(append: Append, node: Node) -> Parts:
    """A cache_attention append (attention.py) as a kernel part."""
    return Parts(append.bound, [append.written], append.lines, "", append.in_types, ["f32"], append.threads,
                 [node.name], "cache_attention:append", status=False)


def _body(node: Node, graph: Graph, folded: dict[str, Node], int4_half: bool) -> Body:
    body = node_body(node, graph, int4_half)
    norm = folded.get(node.inputs[0]) if node.op in MATMULS else None
    return fold_norm(body, norm, graph) if norm is not None else body


def merge(parts: list[Parts]) -> Kernel:
    """One dispatch running each part over its own range of threads (horizontal fusion: a decoder's q and
    k|v projections, RoPE of q and of k, the scores against the cache and the new row). Bindings are
    renumbered so every value is bound once; each part's inline functions get a prefix of their own."""
    if len(parts) == 1:
        p = parts[0]
        source = shader_source(p.in_types, p.lines, p.out_types, p.threads, status=p.status, helpers=p.helpers)
        return Kernel(source, [*p.bound, *p.stored], p.threads, p.nodes, label=p.label, status=p.status,
                      n_outputs=len(p.stored))
    bound: list[str] = []
    in_types: list[str] = []
    for p in parts:
        for v, t in zip(p.bound, p.in_types):
            if v not in bound:
                bound.append(v)
                in_types.append(t)
    lines: list[str] = []
    helpers = []
    stored: list[str] = []
    first = 0
    for n, p in enumerate(parts):
        slot = [bound.index(v) for v in p.bound]
        out0 = len(stored)

        def renumber(text: str, slot: list[int] = slot, out0: int = out0, n: int = n) -> str:
            text = _LOAD.sub(lambda m: f"in{slot[int(m.group(1))]}[", text)
            text = _STORE.sub(lambda m: f"out{out0 + int(m.group(1))}[", text)
            return _FUNCTION.sub(lambda m: f"f{n}_{m.group(1)}(", text)
        body = [renumber(line) for line in p.lines]
        helpers.append(renumber(p.helpers))
        test = f"idx < {first + p.threads}u"
        shift = [f"let idx = idx - {first}u;"] if first else []
        lines += [f"{'if' if not n else '} else if'} ({test}) {{", *shift, *body]
        stored += p.stored
        first += p.threads
    lines.append("}")
    out_types = [t for p in parts for t in p.out_types]
    status = any(p.status for p in parts)  # one status word, set by whichever part finds bad input
    source = shader_source(in_types, lines, out_types, first, status=status, helpers="".join(helpers))
    return Kernel(source, [*bound, *stored], first, [v for p in parts for v in p.nodes],
                  label=" & ".join(p.label for p in parts), status=status, n_outputs=len(stored))


_LOAD = re.compile(r"\bin(\d+)\[")
_STORE = re.compile(r"\bout(\d+)\[")
_FUNCTION = re.compile(r"\bf_(\d+)\(")


def _shift_loads(line: str, by: int) -> str:
    return _LOAD.sub(lambda m: f"in{by + int(m.group(1))}[", line)


def _bind_once(bound: list[str], lines: list[str], helpers: str = "") -> tuple[list[str], tuple[list[str], str]]:
    """Bind each value the code reads once (x * x reads one binding; an inline value's placeholder is not
    read at all): fewer bindings, and no two writable bindings of one range, which browsers' WebGPU refuses
    as aliasing."""
    used = sorted({int(m.group(1)) for text in (*lines, helpers) for m in _LOAD.finditer(text)})
    unique: list[str] = []
    slot: dict[int, int] = {}
    for j in used:
        if bound[j] not in unique:
            unique.append(bound[j])
        slot[j] = unique.index(bound[j])
    if unique == bound:
        return bound, (lines, helpers)

    def sub(text: str) -> str:
        return _LOAD.sub(lambda m: f"in{slot[int(m.group(1))]}[", text)
    return unique, ([sub(line) for line in lines], sub(helpers))
