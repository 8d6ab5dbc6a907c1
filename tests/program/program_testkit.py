"""Shared by the program-format tests and the fuzz worker: a sample graph, graph equality, and file surgery.

File surgery takes a valid program apart (header, JSON document, data region) and puts a modified one back
together with a correct checksum, so tests reach the reader's validation rather than only its checksum.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import canonical_json_bytes
from edgerun.program.format import HEADER_SIZE, Header
from edgerun.program.writer import seal

# Field name -> byte offset and struct code within the header (see edgerun/program/format.py).
HEADER_FIELDS = {
    "magic": (0, "4s"), "major": (4, "<H"), "minor": (6, "<H"), "flags": (8, "<I"), "header_size": (12, "<I"),
    "file_length": (16, "<Q"), "graph_offset": (24, "<Q"), "graph_length": (32, "<Q"),
    "data_offset": (40, "<Q"), "data_length": (48, "<Q"), "checksum": (56, "32s"), "reserved": (88, "40s"),
}


def sample_arrays() -> dict[str, np.ndarray]:
    """One or more constants of every dtype, with the awkward cases: special floats, 0-d, empty, strided."""
    rng = np.random.default_rng(7)
    f16_bits = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0x0001, 0x03FF, 0x7BFF, 0x3C00], np.uint16)
    return {
        "w_f32": rng.standard_normal((4, 3)).astype(np.float32),
        "w_f16": f16_bits.view(np.float16),  # ±0, ±inf, a NaN payload, subnormals, max: bit-exact or bust
        "w_i8": np.array([-128, -1, 0, 1, 127], np.int8),
        "w_u8": np.arange(0, 256, 17, dtype=np.uint8).reshape(4, 4),
        "w_i32": np.array([[np.iinfo(np.int32).min, 0], [1, np.iinfo(np.int32).max]], np.int32),
        "w_i64": np.array([np.iinfo(np.int64).min, -1, np.iinfo(np.int64).max], np.int64),
        "w_bool": np.array([[True, False, True], [False, False, True]]),
        "w_scalar": np.array(3.5, np.float32),  # 0-d
        "w_empty": np.zeros((0, 5), np.float16),  # zero-size
        "w_strided": np.arange(48, dtype=np.int32).reshape(6, 8)[::2, 1::3],  # non-contiguous source
        "w_fortran": np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32)),
        "w_bigendian": np.arange(5, dtype=">i4"),
        "w_tied": rng.standard_normal((4, 3)).astype(np.float32),
    }


def build_sample_graph() -> Graph:
    g = Graph()
    x = g.add_input("x", TensorSpec((4, 3), DType.float32))
    ids = g.add_input("ids", TensorSpec((2,), DType.int64))
    arrays = sample_arrays()
    for name, array in arrays.items():
        g.add_constant(array, name=name)
    # Same bytes as w_tied: the writer stores it once (tied embeddings).
    g.add_constant(arrays["w_tied"].copy(), name="w_tied_again")
    (h,) = g.add_node("matmul_like", [x, "w_f32"], [TensorSpec((4, 3), DType.float32)],
                      attrs={"transpose": False, "alpha": 1.25, "pads": [0, 1, 2], "nested": {"a": [[1], {"b": None}]},
                             "name": "ünïcode ✓", "big": 2**62, "neg": -7, "tiny": 5e-324},
                      meta={"module_path": "model.layer0", "source": "model.py:12"}, hint="mm")
    (c,) = g.add_node("clamp", [h, "", "w_scalar"], [TensorSpec((4, 3), DType.float32)],
                      attrs={"min": float("-inf"), "max": float("inf")})
    (e,) = g.add_node("gather", ["w_tied", ids], [TensorSpec((2, 3), DType.float32)], attrs={"axis": 0})
    a, b = g.add_node("some_future_op", [c, "w_tied_again", "w_bool"],
                      [TensorSpec((4, 3), DType.float32), TensorSpec((), DType.int64)])
    g.add_node("noop_no_outputs", [], [])
    g.outputs = [a, e, b, x, "w_i8"]
    return g


def assert_graphs_equal(a: Graph, b: Graph) -> None:
    assert a.inputs == b.inputs
    assert a.outputs == b.outputs
    assert a.specs == b.specs
    assert len(a.nodes) == len(b.nodes)
    for na, nb in zip(a.nodes, b.nodes):
        assert (na.op, na.name, na.inputs, na.outputs, na.meta) == (nb.op, nb.name, nb.inputs, nb.outputs, nb.meta)
        # Through JSON text, so that tuples equal lists and -inf equals -inf regardless of object identity.
        assert json.dumps(_lists(na.attrs), sort_keys=True) == json.dumps(nb.attrs, sort_keys=True)
        assert type(na.attrs) is dict and type(nb.attrs) is dict
    assert list(a.constants) == list(b.constants)
    for name, x in a.constants.items():
        y = b.constants[name]
        assert y.dtype == np.dtype(DType.of(x).value), name
        assert y.shape == np.shape(x), name
        assert y.tobytes() == np.ascontiguousarray(x, dtype=y.dtype).tobytes(), name


def _lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


# -- file surgery -----------------------------------------------------------------------------------------
def split_program(raw: bytes) -> tuple[Header, dict[str, Any], bytes]:
    """(header, JSON document, data region) of a valid program."""
    header = Header.unpack(raw)
    section = raw[header.graph_offset:header.graph_offset + header.graph_length]
    return header, json.loads(section), raw[header.data_offset:]


def reseal(document: Any, data: bytes, *, graph_section: bytes | None = None, **header_fields: int) -> bytes:
    """A program with the given document (or raw graph-section bytes) and data, with a valid checksum."""
    section = canonical_json_bytes(document) if graph_section is None else graph_section
    return seal(section, len(data), **header_fields) + data


def set_header_field(raw: bytes, field: str, value: Any) -> bytes:
    offset, code = HEADER_FIELDS[field]
    packed = struct.pack(code, value)
    return raw[:offset] + packed + raw[offset + len(packed):]


def get_header_field(raw: bytes, field: str) -> Any:
    offset, code = HEADER_FIELDS[field]
    return struct.unpack_from(code, raw, offset)[0]


assert max(o + struct.calcsize(c) for o, c in HEADER_FIELDS.values()) == HEADER_SIZE
