"""Real models from PyPI wheels, each imported ONCE with bounded symbolic dimensions and run at several input
sizes (and, for the VAD, over calls that feed its state back), against ONNX Runtime on the same inputs.

Before symbolic dimensions each of these had to be re-imported for every input size (input_shapes pinned).
"""

from __future__ import annotations

import numpy as np
import pytest
from wheel_models import wheel_model

import edgerun
from edgerun.errors import EdgerunError
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.specialize import bind_symbols, specialize
from edgerun.oracle import interpret
from edgerun.program import Program

ort = pytest.importorskip("onnxruntime")


def _check_sizes(path, input_shapes, sizes, rtol=1e-4, atol=1e-4, via_file=None):
    program = from_onnx(str(path), input_shapes=input_shapes)
    assert program.graph.symbols, "the program must be a template, not pinned to one size"
    if via_file is not None:  # the template's symbolic shapes and attributes survive the program file
        program.save(via_file)
        program = Program.read(via_file)
    model = edgerun.load(program, backends="reference")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    rng = np.random.default_rng(0)
    for shape in sizes:
        x = rng.standard_normal(shape).astype(np.float32)
        got = model(x)
        got = list(got) if isinstance(got, tuple | list) else [got]
        want = session.run(None, {name: x})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return model


def test_rapidocr_text_direction_classifier_batch_and_width():
    path = wheel_model("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    _check_sizes(path, {"x": (("batch", 1, 4), 3, 48, ("width", 48, 640))},
                 [(1, 3, 48, 192), (3, 3, 48, 96), (2, 3, 48, 320)], atol=1e-5)


def test_rapidocr_text_detector_page_sizes_multiples_of_32(tmp_path):
    """PP-OCRv4 halves H and W five times and doubles them back: the adds line up only on multiples of 32,
    which ("H", 32, 1024, 32) declares; any page size in the bounds runs without a re-import."""
    path = wheel_model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
    model = _check_sizes(path, {"x": (("batch", 1, 2), 3, ("H", 32, 1024, 32), ("W", 32, 1024, 32))},
                         [(1, 3, 64, 96), (1, 3, 96, 64), (2, 3, 32, 64)], via_file=tmp_path / "det.edgerun")
    with pytest.raises(EdgerunError, match=r"input 'x' dimension 2 is 100: the program needs a multiple of 32"):
        model(np.zeros((1, 3, 100, 96), np.float32))


def test_rapidocr_text_recognizer_batch_and_width():
    path = wheel_model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    _check_sizes(path, {"x": (("batch", 1, 4), 3, 48, ("width", 48, 1024))}, [(1, 3, 48, 80), (2, 3, 48, 160)])


def _vad_calls(model, session, lengths, extra=None):
    rng = np.random.default_rng(0)
    ours = theirs = np.zeros((2, 1, 128), np.float32)
    for n in lengths:
        x = (rng.standard_normal((1, n)) * 0.3).astype(np.float32)
        prob, ours = model(x, ours)
        want, theirs = session.run(None, {"input": x, "state": theirs, **(extra or {})})
        np.testing.assert_allclose(prob, want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


VAD_LENGTHS = [576, 576, 320, 703, 192, 576]  # samples per call; 576 is 512 plus silero's 64 of context


def test_silero_vad_state_fed_back_over_calls_of_several_lengths():
    """silero-vad's 16 kHz model (input (batch, sequence), state (2, batch, 128)): its If on 'one STFT frame'
    is decided by the bounds (192..703 samples give one frame), so one template runs every chunk length."""
    path = wheel_model("silero_vad", "data/silero_vad_half.onnx")
    model = edgerun.load(from_onnx(str(path), input_shapes={"input": (1, ("sequence", 192, 703))}),
                         backends="reference")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _vad_calls(model, session, VAD_LENGTHS)


def test_silero_vad_main_model_with_its_sample_rate_fixed():
    """The model silero_vad loads by default: an If on the sample-rate input picks a whole 8 kHz or 16 kHz
    model. The rate is a setting, fixed once (constant_inputs); the chunk length stays symbolic."""
    path = wheel_model("silero_vad", "data/silero_vad.onnx")
    program = from_onnx(str(path), input_shapes={"input": (1, ("sequence", 192, 703)), "state": (2, 1, 128)},
                        constant_inputs={"sr": np.array(16000)})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _vad_calls(edgerun.load(program, backends="reference"), session, VAD_LENGTHS[:4],
               extra={"sr": np.array(16000)})


def test_basic_pitch_batch():
    """Spotify's basic-pitch (a TF export: INT32_MAX slice ends, Shape/Cast/Where arithmetic) over a symbolic
    batch. Each batch runs the template's specialisation on the reference interpreter directly: the full load
    path (the optimising passes per shape) takes about 40 s on this model per new shape, and the other models
    here cover it."""
    path = wheel_model("basic_pitch", "saved_models/icassp_2022/nmp.onnx")
    graph = from_onnx(str(path), input_shapes={"serving_default_input_2:0": (("batch", 1, 4), 43844, 1)}).graph
    assert graph.symbols == {"batch": (1, 4)}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        x = rng.standard_normal((batch, 43844, 1)).astype(np.float32)
        concrete = specialize(graph, bind_symbols(graph, {graph.inputs[0]: x.shape}))
        got = interpret(concrete, [x])
        want = session.run(None, {"serving_default_input_2:0": x})
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def _vad_calls_with_rate(model, session, lengths, sr):
    """Calls feeding the state back, each with its own chunk length, the sample rate a run-time input."""
    rng = np.random.default_rng(sr)
    ours = theirs = np.zeros((2, 1, 128), np.float32)
    for n in lengths:
        x = (rng.standard_normal((1, n)) * 0.3).astype(np.float32)
        feeds = {"input": x, "state": ours, "sr": np.array(sr)}
        prob, ours = model(*[feeds[name] for name in model.input_names])
        want, theirs = session.run(None, {"input": x, "state": theirs, "sr": np.array(sr)})
        np.testing.assert_allclose(prob, want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backends", ["reference", ["onnxruntime", "reference"]])
def test_silero_vad_main_model_symbolic_chunk_with_the_rate_at_run_time(backends):
    """The default model with `sr` left a run-time input: its If picks the 16 kHz or the 8 kHz network, and
    inside each the decoder squeezes the STFT's frame count, which the bounds must make 1. Over 192..703 samples the
    16 kHz branch always has one frame and the 8 kHz one does not (352 samples give it two): that branch is
    left out and taking it is a clear run-time error, while every 16 kHz chunk length runs from one import."""
    path = wheel_model("silero_vad", "data/silero_vad.onnx")
    program = from_onnx(str(path), input_shapes={"input": (1, ("sequence", 192, 703)), "state": (2, 1, 128)})
    assert program.graph.symbols == {"sequence": (192, 703)} and "sr" in program.graph.inputs
    (cond,) = [n for n in program.graph.nodes if n.op == "cond"]
    assert cond.attrs["else"] == "" and "only some of the sizes the bounds allow" in cond.attrs["unreachable"]
    model = edgerun.load(program, backends=backends)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _vad_calls_with_rate(model, session, VAD_LENGTHS, 16000)
    with pytest.raises(EdgerunError, match="took its else branch"):
        _vad_calls_with_rate(model, session, [288], 8000)


def test_silero_vad_main_model_symbolic_chunk_serves_both_rates():
    """Bounds within which both networks see one frame (192..351 samples): one import serves both rates."""
    path = wheel_model("silero_vad", "data/silero_vad.onnx")
    program = from_onnx(str(path), input_shapes={"input": (1, ("sequence", 192, 351)), "state": (2, 1, 128)})
    (cond,) = [n for n in program.graph.nodes if n.op == "cond"]
    assert cond.attrs["then"] and cond.attrs["else"]
    model = edgerun.load(program, backends="reference")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for sr in (8000, 16000):
        _vad_calls_with_rate(model, session, [288, 351, 192, 288, 300], sr)
