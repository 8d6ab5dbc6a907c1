"""Run one ONNX node on ONNX Runtime with given inputs: the peer our integer kernels are checked against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def single_node_model(op_type: str, inputs: Sequence[np.ndarray | None], n_outputs: int = 1,
                      domain: str = "", opset: int = 21, output_shape: Sequence[int] | None = None,
                      **attrs: Any) -> onnx.ModelProto:
    """A model whose graph inputs are `inputs` (None: an omitted optional input) feeding one node.

    Output types are what ONNX infers; a contrib op's single output is float32 of `output_shape`.
    """
    names, graph_inputs = [], []
    for i, arr in enumerate(inputs):
        if arr is None:
            names.append("")
            continue
        names.append(f"in{i}")
        graph_inputs.append(helper.make_tensor_value_info(
            f"in{i}", helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [onnx.ValueInfoProto(name=o) for o in outs])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    inferred = {v.name: v.type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for out in model.graph.output:
        if out.name in inferred and inferred[out.name].tensor_type.elem_type:
            out.type.CopyFrom(inferred[out.name])
        else:
            out.type.CopyFrom(helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, list(output_shape or [])))
    return model


def run_ort(model: onnx.ModelProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {f"in{i}": a for i, a in enumerate(inputs) if a is not None}
    return [np.asarray(o) for o in sess.run(None, feed)]
