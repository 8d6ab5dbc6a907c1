"""Models made by ONNX Runtime's own tools (quantize_dynamic, quantize_static in QOperator form, the
transformer optimizer), CI-sized, imported and compared with ONNX Runtime; and the int8 captcha reader a
PyPI wheel ships (ddddocr), whole, DynamicQuantizeLSTM included. bench/ort_made_models.py does the same
for the zoo's MiniLM and ResNet-18."""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


def _export(module: Any, args: tuple[Any, ...], path: Path, names: list[str], dynamic: dict[str, Any]) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), opset_version=17, dynamo=False, input_names=names,
                          dynamic_axes=dynamic)


def _compare(path: Path, feeds: Callable[[int], dict[str, np.ndarray]], sizes: tuple[int, ...],
             tolerance: float) -> list[str]:
    """Import at each size, run on the reference interpreter and on ORT; the contrib ops the model uses."""
    model = onnx.load(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size in sizes:
        inputs = feeds(size)
        program = from_onnx(str(path), input_shapes={k: v.shape for k, v in inputs.items()})
        got = interpret(program.graph, [inputs[i.name] for i in model.graph.input if i.name in inputs])
        want = session.run(None, inputs)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert np.abs(g - w).max() <= tolerance * max(np.abs(w).max(), 1e-6)
    return sorted({n.op_type for n in model.graph.node if n.domain == "com.microsoft"})


def test_quantize_dynamic_lstm(tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(12, 16, num_layers=2, bidirectional=True).eval()
    _export(lstm, (torch.randn(5, 2, 12),), tmp_path / "f.onnx", ["x"], {"x": {0: "seq"}})
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"))
    ops = _compare(tmp_path / "q.onnx",
                   lambda n: {"x": np.random.default_rng(n).standard_normal((n, 2, 12)).astype(np.float32)},
                   (4, 9), 1e-5)
    assert ops == ["DynamicQuantizeLSTM"]


class _Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1))
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.body(h))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(h, 1), 1))


def test_quantize_static_qoperator_residual_cnn_is_bit_exact(tmp_path: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    torch.manual_seed(1)
    _export(_Residual().eval(), (torch.randn(1, 3, 16, 16),), tmp_path / "f.onnx", ["x"], {"x": {0: "batch"}})

    def image(n: int) -> np.ndarray:
        return np.random.default_rng(n).standard_normal((n, 3, 16, 16)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": image(1)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)
    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QOperator)
    ops = _compare(tmp_path / "q.onnx", lambda n: {"x": image(n)}, (1, 3), 0.0)
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= set(ops)


def test_transformer_optimizer_and_quantize_dynamic_on_a_small_bert(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(2)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64,
                                     attn_implementation="eager")  # the pattern ORT's optimizer fuses
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    def feeds(length: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(length)
        mask = np.ones((2, length), np.int64)
        mask[1, length // 2:] = 0  # the second sequence is padded
        return {"input_ids": rng.integers(0, 100, (2, length)), "attention_mask": mask,
                "token_type_ids": np.zeros((2, length), np.int64)}
    example = tuple(torch.from_numpy(v) for v in feeds(8).values())
    _export(Encoder().eval(), example, tmp_path / "f.onnx", names, {n: {0: "batch", 1: "seq"} for n in names})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimize_model(str(tmp_path / "f.onnx"), model_type="bert", num_heads=4,
                       hidden_size=32).save_model_to_file(str(tmp_path / "opt.onnx"))
    ops = _compare(tmp_path / "opt.onnx", feeds, (8, 13), 1e-5)
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization"} <= set(ops)
    quantize_dynamic(str(tmp_path / "opt.onnx"), str(tmp_path / "q.onnx"), extra_options={"DefaultTensorType": 1})
    # Dynamic quantization rounds activations at run time: an ulp of difference upstream (erf, softmax) can
    # move a value across a rounding step, so the quantized model agrees to a few steps, not bit for bit.
    ops = _compare(tmp_path / "q.onnx", feeds, (8,), 2e-2)
    assert {"QAttention", "QEmbedLayerNormalization"} <= set(ops)


def test_ddddocr_int8_captcha_reader_whole(recwarn: pytest.WarningsRecorder) -> None:
    """The wheel's model, quantized by ORT's quantize_dynamic: a ConvInteger CNN, a DynamicQuantizeLSTM and
    a MatMulInteger head. Its declared output shape is stale (rank 2 for a rank-3 value): ORT warns, so
    does the import."""
    spec = importlib.util.find_spec("ddddocr")  # located, never imported: it pulls in OpenCV
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ddddocr is not installed (scripts/setup.sh installs it with --no-deps)")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "common_old.onnx")
    x = _captcha_like(96)
    program = from_onnx(path, input_shapes={"input1": x.shape})
    assert any("declared" in str(w.message) for w in recwarn)
    got = interpret(program.graph, [x])[0]
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input1": x})[0]
    assert got.shape == want.shape == (12, 1, 8210)
    # Activations are quantized at run time after every layer: ORT's sigmoid is an ulp off the correctly
    # rounded one, which can flip a later quantization step, so the logits agree closely, not bit for bit.
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def _captcha_like(width: int) -> np.ndarray:
    """A grey image with dark strokes, normalised as ddddocr does ((pixel / 255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(0)
    img = np.full((64, width), 220.0) + rng.normal(0, 12, (64, width))
    for c in range(5):
        x0 = 8 + c * (width - 16) // 5
        for _ in range(6):
            r, col = rng.integers(12, 52), x0 + rng.integers(0, 12)
            img[r - 2:r + 2, col:col + 6] = 40
            img[12:52, col] = 50
    return (((np.clip(img, 0, 255) / 255.0) - 0.5) / 0.5).astype(np.float32)[None, None]
