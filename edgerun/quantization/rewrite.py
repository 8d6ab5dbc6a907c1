"""The graph rewrites: each quantized layer becomes integer ops whose last output keeps the float layer's name.

Keeping the name means the layer's consumers are untouched and the per-layer report can compare the same
value in the float and the quantized graph. The forms (ONNX Runtime's, so a delegate maps them 1:1):

- int8 static:  quantize_linear(x) -> conv_integer / matmul_integer (int32) + int32 bias -> requantize(float32)
  -> uint8, dequantized for float readers (ReLU/ReLU6 folded in: the uint8 result stands for the
  activation's output; a linear layer's following bias add folded into the int32 bias); a following layer
  reads the uint8 value directly. Layers producing a graph output end in dequantize_linear(acc, s_x * s_w)
  (+ float bias) instead. One quantize_linear per float activation value, shared by every layer that
  reads it. (Linear layers come here only with static_linear; else int8 dynamic's form.)
- int8 dynamic: dynamic_quantize(x) -> matmul_integer / conv_integer -> dequantize_linear(acc, s_x * s_w).
- int4 weight:  matmul_int4(x, packed, scales, zero points).
- 8da4w:        dynamic_quantize(x, int8, per token) -> dequantize_linear -> matmul_int4 (symmetric weights).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.quantization.weights import int4_groups, int8_per_channel


@dataclass(frozen=True)
class Layer:
    """A float layer the scheme can quantize: conv2d or matmul with a constant weight."""

    node: Node
    weight: np.ndarray

    @property
    def activation(self) -> str:
        return self.node.inputs[0]

    @property
    def output(self) -> str:
        return self.node.outputs[0]


def find_layers(graph: Graph, ops: tuple[str, ...]) -> list[Layer]:
    layers = []
    for node in graph.nodes:
        if node.op not in ops or len(node.inputs) < 2 or node.inputs[1] not in graph.constants:
            continue
        w = graph.constants[node.inputs[1]]
        if w.dtype != np.float32 or graph.specs[node.inputs[0]].dtype.value != "float32":
            continue
        if node.op == "matmul" and (w.ndim != 2 or graph.specs[node.inputs[0]].rank < 2):
            continue
        layers.append(Layer(node, w))
    return layers


def _named(b: Builder, name: str, op: str, inputs: list[str], **attrs: object) -> str:
    """Emit op with its output called `name` (the float layer's output it replaces)."""
    tmp = b.emit(op, inputs, **attrs)
    node = b.graph.nodes[-1]
    b.graph.specs[name] = b.graph.specs.pop(tmp)
    node.outputs[0] = node.name = name
    return name


def _finish(b: Builder, layer: Layer, acc: str, scale: str) -> None:
    """acc (int32) * scale (+ the float bias) under the layer's own output name."""
    zero = b.const(np.zeros((), np.int32))
    node = layer.node
    bias = node.inputs[2] if node.op == "conv2d" and len(node.inputs) > 2 and node.inputs[2] else ""
    if not bias:
        _named(b, layer.output, "dequantize_linear", [acc, scale, zero])
        return
    y = b.emit("dequantize_linear", [acc, scale, zero])
    oc = b.shape(bias)[0]
    _named(b, layer.output, "add", [y, b.emit("reshape", [bias], shape=[oc, 1, 1])])


def _integer_op(b: Builder, layer: Layer, xq: str, x_zp: str, qmax: int) -> tuple[str, np.ndarray]:
    """The int32 conv_integer/matmul_integer of the layer on xq, and the weight's per-channel scale."""
    node = layer.node
    if node.op == "conv2d":
        wq, w_scale = int8_per_channel(layer.weight, axis=0, qmax=qmax)
        acc = b.emit("conv_integer", [xq, b.const(wq), x_zp, b.const(np.zeros((), np.int8))], **node.attrs)
        return acc, w_scale.reshape(-1, 1, 1)
    wq, w_scale = int8_per_channel(layer.weight, axis=1, qmax=qmax)
    acc = b.emit("matmul_integer", [xq, b.const(wq), x_zp, b.const(np.zeros((), np.int8))])
    return acc, w_scale


def _replace_layers(graph: Graph, layers: list[Layer], emit: Callable[[Builder, Layer], None],
                    drop: frozenset[str] = frozenset(),
                    others: Mapping[str, Callable[[Builder, Node], None]] | None = None) -> Graph:
    """Each chosen layer's node is replaced, in place in the node order, by what `emit` builds for it (and
    each node whose output `others` names, by what its function builds); nodes producing a value in `drop`
    (activations folded into a layer) go."""
    chosen = {layer.output: layer for layer in layers}
    old, graph.nodes = graph.nodes, []
    for node in old:
        out = node.outputs[0] if node.outputs else ""
        layer = chosen.get(out)
        if layer is not None:
            emit(Builder(graph, node.meta), layer)
        elif others and out in others:
            others[out](Builder(graph, node.meta), node)
        elif out not in drop:
            graph.nodes.append(node)
    return graph


def linear_bias(graph: Graph, layer: Layer) -> tuple[str, str] | None:
    """(the add's output, the bias constant) when a linear layer's only reader adds a constant float32 bias
    along its output features (an exported nn.Linear: matmul -> add): folded into the int32 accumulator."""
    if layer.node.op != "matmul" or layer.output in graph.outputs:
        return None
    readers = [n for n in graph.nodes if layer.output in n.inputs]
    if len(readers) != 1 or readers[0].op != "add" or len(readers[0].inputs) != 2:
        return None
    add = readers[0]
    bias = next((v for v in add.inputs if v != layer.output), "")
    value = graph.constants.get(bias)
    n = layer.weight.shape[1]
    if value is None or value.dtype != np.float32 or value.size != n or value.shape[-1:] != (n,) \
            or value.ndim > graph.specs[layer.output].rank:
        return None
    return add.outputs[0], bias


def folded_output(graph: Graph, layer: Layer) -> str:
    """The value a requantized layer's uint8 output stands for: its ReLU's (or clamp(0, hi)'s) output when
    that is the only reader of the layer's result (a linear layer's after its folded bias), else that result.

    Exact to fold: the activation's output is calibrated from 0 (zero point 0), and requantization
    saturates at 0 and at the calibrated top, which is at most the clamp's.
    """
    bias = linear_bias(graph, layer)
    return _after_activation(graph, bias[0] if bias else layer.output)


def _after_activation(graph: Graph, end: str) -> str:
    """`end`'s ReLU (or clamp(0, hi), maximum(x, 0)) output when that is its only reader, else `end`."""
    readers = [n for n in graph.nodes if end in n.inputs]
    if end in graph.outputs or len(readers) != 1:
        return end
    act = readers[0]
    if act.op == "relu" or (act.op == "clamp" and act.attrs.get("min") == 0 and (act.attrs.get("max") or 1) > 0):
        return act.outputs[0]
    zero = [graph.constants.get(v) for v in act.inputs if v != end]
    if act.op == "maximum" and len(zero) == 1 and zero[0] is not None and zero[0].size == 1 and not zero[0].any():
        return act.outputs[0]
    return end


def uint8_glue(graph: Graph, uint8_values: set[str]) -> dict[str, str]:
    """The nodes between integer layers that can stay uint8, in graph order: node output -> the value its
    uint8 result stands for. Inputs are uint8 when they are in `uint8_values` (requantized layers' results)
    or an earlier such node's result:

    - an add of two same-shaped uint8 values runs as quantized_add (ONNX Runtime's QLinearAdd) into its own
      calibrated range, its ReLU folded as for layers (the value is then the ReLU's output): a residual
      network stays uint8 from block to block;
    - a max_pool2d keeps its input's scale and zero point (its values are some of its input's: nothing to
      calibrate, nothing clipped), so dequantize -> max pool -> quantize gives the max of the codes exactly
      (dequantization is increasing), which a backend may run as a max pool of the codes (ONNX Runtime's
      uint8 MaxPool, edgerun/backends/onnxruntime/onnx_quant_ops.py); the graph stays float there, so every
      backend with a float max pool runs it.

    An add or pool producing a graph output stays float.
    """
    available = set(uint8_values)
    glue: dict[str, str] = {}
    for node in graph.nodes:
        if not node.outputs or node.outputs[0] in graph.outputs or not node.inputs \
                or not set(node.inputs) <= available:
            continue
        if node.op == "max_pool2d":
            glue[node.outputs[0]] = node.outputs[0]
            available.add(node.outputs[0])
            continue
        if node.op != "add" or len(node.inputs) != 2:
            continue
        a, b = (graph.specs[v] for v in node.inputs)
        out = _after_activation(graph, node.outputs[0])
        if a.shape == b.shape and a.dtype is DType.float32 and out not in graph.outputs:
            glue[node.outputs[0]] = out
            available.add(out)
    return glue


def requantizable(graph: Graph, layer: Layer) -> bool:
    """A layer whose result can stay uint8 (QLinearConv's or QLinearMatMul's form): not a graph output, and a
    conv's bias a constant or none (a linear layer's bias is a separate add: folded when linear_bias finds it)."""
    node = layer.node
    if node.op == "matmul":
        folded = linear_bias(graph, layer)
        return (folded[0] if folded else layer.output) not in graph.outputs
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    return node.op == "conv2d" and (not bias or bias in graph.constants) and layer.output not in graph.outputs


def rewrite_int8_static(graph: Graph, layers: list[Layer], params: dict[str, tuple[np.ndarray, np.ndarray]],
                        outputs: dict[str, str], qmax: int = 127,
                        uint8_results: dict[str, tuple[str, np.ndarray, np.ndarray]] | None = None,
                        glue: dict[str, str] | None = None) -> Graph:
    """`params`: float value -> uint8 (scale, zero point) from calibration; weights in [-qmax, qmax].

    `outputs`: layer output -> the value its requantized uint8 result stands for (folded_output), for the
    layers that stay integer to their output (conv_integer + int32 bias + requantize, ONNX Runtime's
    QLinearConv); the others end in dequantize_linear(acc, s_x * s_w) + float bias. A layer reading another's
    uint8 result uses it directly: a quantize of its dequantized value would give it back unchanged.
    `uint8_results`, when given, receives float value -> (its uint8 value, scale, zero point) for the report
    (the float value itself is gone when only integer layers read it). `glue`: uint8_glue's result, each
    add there becoming quantized_add of its two uint8 inputs, requantized to its (folded) output's calibrated
    range; its max pools stay as they are (`params` gives their outputs their inputs' ranges).
    """
    quantized: dict[str, tuple[str, str, np.ndarray]] = {}  # float value -> (uint8 value, zero point, scale)
    # linear layers' folded bias adds: layer output -> (the add's output, its float bias constant)
    biases = {layer.output: bias for layer in layers if layer.output in outputs
              for bias in [linear_bias(graph, layer)] if bias is not None}

    def uint8_input(b: Builder, x: str) -> tuple[str, str, np.ndarray]:
        if x not in quantized:
            scale, zp = params[x]
            x_zp = b.const(zp)
            quantized[x] = (b.emit("quantize_linear", [x, b.const(scale), x_zp]), x_zp, scale)
        return quantized[x]

    def uint8_output(b: Builder, out: str, yq: str, y_zp: str) -> None:
        """`yq` (in `out`'s calibrated range) stands for float value `out`: later integer nodes read it,
        the report learns it, and `out` becomes its dequantized value for everything else."""
        s_y, zp_y = params[out]
        quantized[out] = (yq, y_zp, s_y)
        if uint8_results is not None:
            uint8_results[out] = (yq, s_y, zp_y)
        _named(b, out, "dequantize_linear", [yq, b.const(s_y), y_zp])

    def emit(b: Builder, layer: Layer) -> None:
        xq, x_zp, s_x = uint8_input(b, layer.activation)
        acc, w_scale = _integer_op(b, layer, xq, x_zp, qmax)
        acc_scale = (s_x * w_scale).astype(np.float32)
        out = outputs.get(layer.output)
        if out is None:
            _finish(b, layer, acc, b.const(acc_scale))
            return
        node = layer.node
        bias = biases[layer.output][1] if layer.output in biases else node.inputs[2] if len(node.inputs) > 2 else ""
        if bias:  # to the accumulator's scale, rounded: ONNX Runtime's quantizer does the same
            bq = np.rint(b.graph.constants[bias].astype(np.float64).reshape(acc_scale.shape) / acc_scale)
            acc = b.emit("add", [acc, b.const(np.clip(bq, -2 ** 31, 2 ** 31 - 1).astype(np.int32))])
        s_y, zp_y = params[out]
        multiplier = (acc_scale / np.float32(s_y)).astype(np.float32)
        y_zp = b.const(zp_y)
        uint8_output(b, out, b.emit("requantize", [acc, b.const(multiplier), y_zp], arithmetic="float32"), y_zp)

    def emit_add(b: Builder, node: Node) -> None:
        ins = []
        for v in node.inputs:
            q, zp, scale = uint8_input(b, v)
            ins += [q, b.const(np.asarray(scale, np.float32).reshape(())), zp]
        out = (glue or {})[node.outputs[0]]
        s_y, zp_y = params[out]
        y_zp = b.const(zp_y)
        uint8_output(b, out, b.emit("quantized_add", [*ins, b.const(np.asarray(s_y, np.float32).reshape(())), y_zp]),
                     y_zp)

    folded = [*(out for name, out in outputs.items() if out != name), *(a for a, _ in biases.values()),
              *(out for name, out in (glue or {}).items() if out != name)]
    adds = {n.outputs[0]: emit_add for n in graph.nodes if n.op == "add" and n.outputs and n.outputs[0] in (glue or {})}
    return _replace_layers(graph, layers, emit, frozenset(folded), others=adds)


EMBEDDING_MIN_ROWS = 256  # gathers from smaller tables (position, token-type embeddings) stay float


def find_embeddings(graph: Graph) -> list[Layer]:
    """Gathers of rows from a large constant float32 table: the embeddings that dominate a language model's size."""
    found = []
    for node in graph.nodes:
        table = graph.constants.get(node.inputs[0]) if node.op == "gather" else None
        if (table is not None and table.dtype == np.float32 and table.ndim == 2 and table.shape[0] >= EMBEDDING_MIN_ROWS
                and int(node.attrs.get("axis", 0)) % 2 == 0):
            found.append(Layer(node, table))
    return found


def rewrite_int8_embeddings(graph: Graph, embeddings: list[Layer]) -> Graph:
    """Tables to int8 with one scale per row; a lookup gathers rows and their scales, then dequantizes."""
    def emit(b: Builder, layer: Layer) -> None:
        q, scale = int8_per_channel(layer.weight, axis=0)
        ids = layer.node.inputs[1]
        rows = b.emit("gather", [b.const(q), ids], axis=0)
        scales = b.emit("gather", [b.const(scale.reshape(-1, 1)), ids], axis=0)
        _named(b, layer.output, "dequantize_linear", [rows, scales, b.const(np.zeros((), np.int8))])

    return _replace_layers(graph, embeddings, emit)


def rewrite_int8_dynamic(graph: Graph, layers: list[Layer], qmax: int = 127) -> Graph:
    def emit(b: Builder, layer: Layer) -> None:
        xq, x_scale, x_zp = b.emit_multi("dynamic_quantize", [layer.activation], dtype="uint8")
        acc, w_scale = _integer_op(b, layer, xq, x_zp, qmax)
        _finish(b, layer, acc, b.emit("mul", [x_scale, b.const(w_scale.astype(np.float32))]))

    return _replace_layers(graph, layers, emit)


def rewrite_int4(graph: Graph, layers: list[Layer], group: int, dynamic_int8_activations: bool) -> Graph:
    def emit(b: Builder, layer: Layer) -> None:
        k, n = layer.weight.shape
        packed, scales, zps = int4_groups(layer.weight, group, symmetric=dynamic_int8_activations)
        x = layer.activation
        if dynamic_int8_activations:
            xq, x_scale, x_zp = b.emit_multi("dynamic_quantize", [x], dtype="int8", per_token=True)
            x = b.emit("dequantize_linear", [xq, x_scale, x_zp])
        ins = [x, b.const(packed), b.const(scales), b.const(zps)]
        _named(b, layer.output, "matmul_int4", ins, k=k, n=n, group_size=group)

    return _replace_layers(graph, layers, emit)
