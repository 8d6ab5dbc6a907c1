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


def device_free_backends() -> list[Any]:
    """Every backend that can be built here without a device (supports() needs the packages, not an adapter):
    the NPU always, ONNX Runtime, MNN and WebGPU where installed."""
    from edgerun.backends.npu import NpuBackend
    out: list[Any] = [NpuBackend()]
    try:
        from edgerun.backends.onnxruntime import OnnxRuntimeBackend
        out.append(OnnxRuntimeBackend(threads=1))
    except ImportError:
        pass
    try:
        from edgerun.backends.mnn import MnnBackend
        out.append(MnnBackend(threads=1))
    except ImportError:
        pass
    try:
        import wgpu  # noqa: F401

        from edgerun.backends.webgpu import WebGpuBackend
        out.append(WebGpuBackend())
    except ImportError:
        pass
    return out
