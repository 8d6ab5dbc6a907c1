"""ONNX ImageDecoder: image_decode on the reference (Pillow), against onnx.reference on real encoded bytes."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import EdgerunError
from edgerun.frontends.onnx import from_onnx
from edgerun.runtime import load

PIL_Image = pytest.importorskip("PIL.Image")
U8 = TensorProto.UINT8


def _model(pixel_format: str = "RGB", after: list | None = None, out: tuple = ("image", U8, ["H", "W", "C"])):
    nodes = [helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=pixel_format), *(after or [])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("data", U8, ["N"])],
                              [helper.make_tensor_value_info(*out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _loaded(model):
    """Imported once with a bounded byte count, run on the reference (the one backend with the kernel)."""
    return load(from_onnx(model, input_shapes={"data": (("N", 0, 1 << 20),)}), backends=["reference"])


def _encoded(fmt: str, height: int, width: int, seed: int = 0, mode: str = "RGB") -> np.ndarray:
    """A smooth image with some noise (so JPEG's lossy path really runs), encoded by Pillow."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx + yy) % 256], axis=-1)
    pixels = np.clip(rgb + rng.integers(-20, 21, rgb.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    PIL_Image.fromarray(pixels).convert(mode).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_decodes_exactly_as_the_onnx_reference(fmt: str, pixel_format: str) -> None:
    model = _model(pixel_format)
    data = _encoded(fmt, 19, 27, seed=1)
    (want,) = ReferenceEvaluator(model).run(None, {"data": data})
    (got,) = _loaded(model).run([data])
    assert got.dtype == np.uint8 and got.shape == (19, 27, 1 if pixel_format == "Grayscale" else 3)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_one_program_decodes_images_of_different_sizes_and_computes_after_them() -> None:
    """Height and width bind at run time (two extent symbols); the ops after the decode follow them."""
    after = [helper.make_node("Transpose", ["image"], ["chw"], perm=[2, 0, 1]),
             helper.make_node("Cast", ["chw"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", TensorProto.INT64, [1], [1])),
             helper.make_node("ReduceMean", ["f", "axes"], ["mean"], keepdims=0)]
    model = _model("BGR", after, ("mean", TensorProto.FLOAT, [3, "W"]))
    loaded = _loaded(model)
    for fmt, h, w in (("PNG", 8, 40), ("JPEG", 33, 5), ("PNG", 1, 1)):
        data = _encoded(fmt, h, w, seed=h)
        (want,) = ReferenceEvaluator(model).run(None, {"data": data})
        (got,) = loaded.run([data])
        assert got.shape == (3, w)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_grayscale_file_decoded_as_rgb_gives_three_channels() -> None:
    """The op declares [H, W, 3] for RGB: a one-channel PNG converts (ONNX's reference would give [H, W])."""
    data = _encoded("PNG", 6, 9, mode="L")
    (got,) = _loaded(_model("RGB")).run([data])
    gray = np.array(PIL_Image.open(io.BytesIO(data.tobytes())))
    assert got.shape == (6, 9, 3)
    for c in range(3):
        np.testing.assert_array_equal(got[:, :, c], gray)


def test_the_onnx_node_cases_count_and_pass_static_and_symbolic() -> None:
    from edgerun.frontends.onnx.categories import DESIGN_CATEGORIES, design_category
    from edgerun.frontends.onnx.conformance import edgerun_runner, node_cases, run_case, symbolic_runner

    assert "image-codec" not in DESIGN_CATEGORIES
    cases = [c for c in node_cases() if c.name.startswith("test_image_decoder_")]
    assert len(cases) == 9  # jpeg rgb/grayscale/bgr, jpeg2k, bmp, png, tiff, webp, pnm
    for case in cases:
        assert design_category(case.model) is None, case.name
        for runner in (edgerun_runner, symbolic_runner):
            result = run_case(case, runner)
            assert result.status == "pass", (case.name, result.detail)


@pytest.mark.parametrize("data", [np.frombuffer(b"this is no image at all", np.uint8), np.zeros(0, np.uint8),
                                  _encoded("PNG", 8, 8)[:40]])
def test_bytes_that_are_no_image_are_a_clear_error(data: np.ndarray) -> None:
    loaded = _loaded(_model())
    with pytest.raises(EdgerunError, match=r"image_decode: \d+ bytes are not an image Pillow can decode"):
        loaded.run([data])


def test_a_missing_pillow_is_a_clear_error_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _loaded(_model())
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # what `import PIL.Image` sees without Pillow installed
    with pytest.raises(EdgerunError, match="needs the 'pillow' package"):
        loaded.run([_encoded("PNG", 4, 4)])


@pytest.mark.parametrize("dtype, shape, fmt, why", [
    (TensorProto.FLOAT, ["N"], "RGB", "1-D uint8"),
    (U8, [2, "N"], "RGB", "1-D uint8"),
    (U8, ["N"], "RGBA", "pixel_format 'RGBA'"),
])
def test_what_imagedecoder_cannot_take_is_refused_by_name(dtype: int, shape: list, fmt: str, why: str) -> None:
    node = helper.make_node("ImageDecoder", ["data"], ["image"], pixel_format=fmt)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("data", dtype, shape)],
                              [helper.make_tensor_value_info("image", U8, ["H", "W", "C"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    with pytest.raises(EdgerunError, match=why):
        from_onnx(model, input_shapes={"data": (*((2,) if len(shape) == 2 else ()), ("N", 0, 1 << 20))})


def test_an_image_wider_than_the_bound_is_a_clear_error_naming_the_symbol() -> None:
    """Height and width are symbols bounded by 65535 (JPEG's own limit); a wider PNG is refused at run time."""
    buf = io.BytesIO()
    PIL_Image.fromarray(np.zeros((1, 70000, 3), np.uint8)).save(buf, format="PNG")
    with pytest.raises(EdgerunError, match=r"dimension 1 is 70000: symbol 'width0' must be within \[0, 65535\]"):
        _loaded(_model()).run([np.frombuffer(buf.getvalue(), np.uint8)])


def test_a_program_that_decodes_survives_the_program_file() -> None:
    """attr extent holds two symbol names: written and read back, the program still decodes."""
    from edgerun.program.program import Program

    program = from_onnx(_model("Grayscale"), input_shapes={"data": (("N", 0, 1 << 20),)})
    again = Program.from_bytes(program.to_bytes())
    data = _encoded("JPEG", 12, 7, seed=3)
    (want,) = ReferenceEvaluator(_model("Grayscale")).run(None, {"data": data})
    (got,) = load(again, backends=["reference"]).run([data])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backends", [["onnxruntime", "reference"], ["mnn", "reference"]])
def test_other_backends_decline_the_decode_and_run_what_follows(backends: list[str]) -> None:
    """No backend but the reference has image_decode; the ops after it still place wherever they would."""
    after = [helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT), helper.make_node("Relu", ["f"], ["y"])]
    model = _model("RGB", after, ("y", TensorProto.FLOAT, ["H", "W", "C"]))
    loaded = load(from_onnx(model, input_shapes={"data": (("N", 0, 1 << 20),)}), backends=backends)
    data = _encoded("PNG", 5, 11, seed=4)
    (want,) = ReferenceEvaluator(model).run(None, {"data": data})
    (got,) = loaded.run([data])
    np.testing.assert_array_equal(got, want)
