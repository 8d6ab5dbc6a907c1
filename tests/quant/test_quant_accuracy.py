"""Accuracy of the schemes on real networks: MiniLM's real weights with int8-dynamic, a zoo CNN int8-static."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import edgerun  # noqa: E402
from edgerun.oracle import interpret  # noqa: E402
from edgerun.quantization import quantize_with_report  # noqa: E402

SENTENCES = (  # four topics, three sentences each
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Wild foxes often hunt small animals at dusk.",
    "How do I bake sourdough bread at home?",
    "What is the best recipe for a crusty loaf of bread?",
    "Kneading dough by hand takes about ten minutes.",
    "Edge devices run compiled neural networks without Python.",
    "Quantized models use eight-bit integers to save memory.",
    "The compiler turns a trained network into a portable program.",
    "The stock market fell sharply after the announcement.",
    "Investors sold shares as interest rates rose.",
    "Bond yields climbed to their highest level this year.",
)


@pytest.mark.slow
def test_minilm_int8_dynamic_keeps_embeddings_and_neighbours() -> None:
    from edgerun.zoo.minilm import build, tokenize
    try:
        module = build()
    except edgerun.EdgerunError as exc:
        pytest.skip(str(exc))
    inputs = tokenize(SENTENCES)
    program = edgerun.export(module, inputs)
    quantized, _report = quantize_with_report(program, "int8-dynamic")
    assert quantized.graph.op_counts()["matmul_integer"] == 36  # 6 layers x (q, k, v, out, 2 feed-forward)
    arrays = [t.numpy() for t in inputs]
    ref = interpret(program.graph, arrays)[0]
    got = interpret(quantized.graph, arrays)[0]
    cos = np.sum(ref * got, axis=1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.99, cos

    def neighbours(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)
    np.testing.assert_array_equal(neighbours(got), neighbours(ref))


@pytest.mark.slow
def test_zoo_cnn_int8_static_calibrated_on_32_inputs_keeps_25_db_on_32_others() -> None:
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image
    module = get("squeezenet1_1").build()
    program = edgerun.export(module, (natural_image(64, seed=0, batch=32),))  # a batch of 32 per call
    calibration = {program.graph.inputs[0]: natural_image(64, seed=1, batch=32).numpy()}
    quantized, report = quantize_with_report(program, "int8-static", calibration, report_samples=1)
    assert quantized.graph.op_counts()["conv_integer"] == 26 and "conv2d" not in quantized.graph.op_counts()
    assert len(report.layers) == 26 and min(r.sqnr_db for r in report.layers) > 25, report.table()
    test = natural_image(64, seed=2, batch=32).numpy()
    ref, got = interpret(program.graph, [test])[0], interpret(quantized.graph, [test])[0]
    sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got.astype(np.float64)) ** 2))
    assert sqnr >= 25, sqnr


def test_zoo_mobilenet_v2_int8_static_keeps_25_db_on_held_out_images_at_32x32() -> None:
    """The issue's target on a deep zoo CNN (53 layers), small enough for CI: data-initialised weights
    (edgerun/zoo/calibration.py) make it behave like a trained network under 8-bit noise."""
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image
    module = get("mobilenet_v2").build()
    program = edgerun.export(module, (natural_image(32, seed=0, batch=32),))
    calibration = {program.graph.inputs[0]: natural_image(32, seed=1, batch=32).numpy()}
    quantized, _ = quantize_with_report(program, "int8-static", calibration, report_samples=0)
    assert quantized.graph.op_counts()["conv_integer"] == 52 and "conv2d" not in quantized.graph.op_counts()
    test = natural_image(32, seed=2, batch=32).numpy()
    ref, got = interpret(program.graph, [test])[0], interpret(quantized.graph, [test])[0]
    sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got.astype(np.float64)) ** 2))
    assert sqnr >= 25, sqnr


@pytest.mark.slow
def test_zoo_resnet18_int8_static_keeps_25_db_on_held_out_images_at_224() -> None:
    """The issue's target at full size (bench/quant_accuracy.py's setting): 32 calibration images, 32 others.
    One held-out image (18) pushed the pooled features 1.35x past their calibrated range (24.6 dB with a
    calibrated classifier input); the per-call range of linear layers' inputs keeps it (39.6 dB)."""
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image
    module = get("resnet18").build().eval()
    program = edgerun.export(module, (natural_image(224, seed=0),))
    calibration = {program.graph.inputs[0]: natural_image(224, seed=1, batch=32).numpy()[:, None]}
    quantized, _ = quantize_with_report(program, "int8-static", calibration, report_samples=0, reduce_range=True)
    test = natural_image(224, seed=100, batch=32).numpy()
    ref = np.stack([interpret(program.graph, [t[None]])[0] for t in test]).astype(np.float64)
    got = np.stack([interpret(quantized.graph, [t[None]])[0] for t in test])
    sqnr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))
    assert sqnr >= 25, sqnr
