"""Small ONNX graphs written by hand for the import tests, and ONNX Runtime's answer on them."""

from __future__ import annotations

from typing import Any

from onnx import TensorProto, helper


def make_model(nodes: Any, inputs: Any, outputs: Any, inits: Any = (), opset: int = 17) -> Any:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def value_info(name: str, shape: Any, elem: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def run_onnxruntime(model: Any, feeds: dict[str, Any]) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
