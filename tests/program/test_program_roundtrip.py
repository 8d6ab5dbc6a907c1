"""Round trips: graph, attrs, meta, metadata and every dtype's bits survive save and load unchanged."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from program_testkit import assert_graphs_equal, build_sample_graph, split_program

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import FORMAT_MAJOR, Program
from edgerun.program.format import ALIGNMENT, HEADER_SIZE, STATIC_FORMAT_MINOR


@pytest.fixture
def program() -> Program:
    return Program(build_sample_graph(), {"producer": "tests", "model_name": "sample", "edgerun_version": "0.1.0",
                                          "free": {"list": [1, 2.5, "x", None, True]}, "n": 3})


@pytest.mark.parametrize("how", ["bytes", "file-mmap", "file-read"])
def test_round_trip_preserves_graph_weights_and_metadata(program: Program, tmp_path, how: str) -> None:
    if how == "bytes":
        loaded = Program.from_bytes(program.to_bytes())
    else:
        program.save(tmp_path / "m.edgr")
        loaded = Program.read(tmp_path / "m.edgr", mmap=how == "file-mmap")
    assert_graphs_equal(program.graph, loaded.graph)
    assert loaded.metadata == program.metadata
    assert loaded.file_info is not None and loaded.file_info.format_version == (FORMAT_MAJOR, STATIC_FORMAT_MINOR)
    assert loaded.file_info.mmapped == (how == "file-mmap")
    assert loaded.file_info.path == (None if how == "bytes" else str(tmp_path / "m.edgr"))


@pytest.mark.parametrize("dtype", [d for d in DType if d is not DType.string])  # strings: test_program_strings.py
def test_every_dtype_round_trips_bit_exactly(dtype: DType) -> None:
    rng = np.random.default_rng(int.from_bytes(dtype.value.encode(), "little") % 2**32)
    raw = rng.integers(0, 256, size=7 * 5 * dtype.itemsize, dtype=np.uint8)
    array = raw.view(dtype.np).reshape(7, 5) if dtype is not DType.bool else (raw[:35] & 1).astype(bool).reshape(7, 5)
    g = Graph()
    g.add_constant(array, name="w")
    g.add_constant(np.zeros((3, 0, 2), dtype.np), name="empty")
    g.add_constant(array[2, 3], name="scalar")
    g.outputs = ["w", "empty", "scalar"]
    loaded = Program.from_bytes(Program(g).to_bytes()).graph.constants
    assert loaded["w"].dtype == dtype.np and loaded["w"].shape == (7, 5)
    assert loaded["w"].tobytes() == array.tobytes()  # bytes, not ==: NaN payloads and -0.0 must survive
    assert loaded["empty"].shape == (3, 0, 2) and loaded["empty"].dtype == dtype.np
    assert loaded["scalar"].shape == () and loaded["scalar"].tobytes() == array[2, 3].tobytes()


def test_noncontiguous_fortran_and_big_endian_sources_are_written_contiguous_little_endian(program: Program) -> None:
    raw = program.to_bytes()
    _, document, data = split_program(raw)
    by_name = {s["name"]: s for s in document["segments"]}
    strided = program.graph.constants["w_strided"]
    assert not strided.flags.c_contiguous
    seg = by_name["w_strided"]
    assert data[seg["offset"]:seg["offset"] + seg["nbytes"]] == np.ascontiguousarray(strided, "<i4").tobytes()
    seg = by_name["w_bigendian"]
    assert data[seg["offset"]:seg["offset"] + seg["nbytes"]] == np.arange(5, dtype="<i4").tobytes()
    loaded = Program.from_bytes(raw).graph.constants
    assert np.array_equal(loaded["w_fortran"], program.graph.constants["w_fortran"])
    assert loaded["w_bigendian"].dtype == np.dtype("int32") and list(loaded["w_bigendian"]) == [0, 1, 2, 3, 4]


def test_segments_are_aligned_in_the_file_and_in_memory(program: Program, tmp_path) -> None:
    raw = program.to_bytes()
    header, document, _ = split_program(raw)
    assert header.data_offset % ALIGNMENT == 0 and header.graph_offset == HEADER_SIZE
    assert all(s["offset"] % ALIGNMENT == 0 for s in document["segments"])
    program.save(tmp_path / "m.edgr")
    for name, array in Program.read(tmp_path / "m.edgr").graph.constants.items():
        if array.size:
            assert array.ctypes.data % ALIGNMENT == 0, name


def test_identical_weights_are_stored_once_and_share_memory(program: Program) -> None:
    raw = program.to_bytes()
    _, document, _ = split_program(raw)
    by_name = {s["name"]: s for s in document["segments"]}
    assert by_name["w_tied"]["offset"] == by_name["w_tied_again"]["offset"]
    loaded = Program.from_bytes(raw).graph.constants
    assert np.shares_memory(loaded["w_tied"], loaded["w_tied_again"])
    assert not np.shares_memory(loaded["w_tied"], loaded["w_f32"])
    # The data region holds each distinct byte string once.
    distinct = {(s["offset"], s["nbytes"]) for s in document["segments"]}
    assert len(distinct) < len(document["segments"])


def test_tuples_in_attrs_come_back_as_lists() -> None:
    g = Graph()
    x = g.add_input("x", TensorSpec((1,), DType.float32))
    g.add_node("pad", [x], [TensorSpec((3,), DType.float32)], attrs={"pads": (1, (2, 3))})
    loaded = Program.from_bytes(Program(g).to_bytes()).graph
    assert loaded.nodes[0].attrs == {"pads": [1, [2, 3]]}


def test_writing_is_deterministic_and_canonical(program: Program) -> None:
    first = program.to_bytes()
    assert first == program.to_bytes()
    again = Program.from_bytes(first)
    assert again.to_bytes() == first
    header, _, _ = split_program(first)
    section = first[header.graph_offset:header.graph_offset + header.graph_length]
    doc = json.loads(section)
    assert json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() == section


def test_default_metadata_names_producer_and_version() -> None:
    import edgerun

    loaded = Program.from_bytes(Program(build_sample_graph()).to_bytes())
    assert loaded.metadata == {"producer": "edgerun", "edgerun_version": edgerun.__version__}


def test_program_hash_is_stable_and_ignores_metadata_and_layout(program: Program, tmp_path) -> None:
    h = program.program_hash()
    assert len(h) == 64 and h == program.program_hash()
    program.save(tmp_path / "m.edgr")
    assert Program.read(tmp_path / "m.edgr").program_hash() == h
    assert Program.read(tmp_path / "m.edgr", verify_weights=False).program_hash() == h
    assert Program(program.graph, {"other": "metadata"}).program_hash() == h
    assert Program(build_sample_graph(), program.metadata).program_hash() == h  # a fresh, equal graph


def test_program_hash_changes_with_any_weight_bit_attr_or_structure(program: Program) -> None:
    h = program.program_hash()
    g = build_sample_graph()
    flipped = g.constants["w_i8"].copy()
    flipped.view(np.uint8)[2] ^= 1
    g.constants["w_i8"] = flipped
    assert Program(g).program_hash() != h
    g = build_sample_graph()
    g.nodes[0].attrs["alpha"] = 1.5
    assert Program(g).program_hash() != h
    g = build_sample_graph()
    g.outputs = g.outputs[:-1]
    assert Program(g).program_hash() != h
    g = build_sample_graph()
    g.constants["w_u8"] = g.constants["w_u8"].copy()
    g.constants["w_u8"][0, 0] += 1  # in-place change of a writeable array must not hit a stale cache
    p = Program(g)
    h1 = p.program_hash()
    p.graph.constants["w_u8"][0, 0] += 1
    assert p.program_hash() != h1


def test_summary_counts_ops_and_weight_bytes(program: Program) -> None:
    s = Program.from_bytes(program.to_bytes()).summary()
    g = program.graph
    assert s.nodes == len(g.nodes) == 5
    assert s.op_counts == {"clamp": 1, "gather": 1, "matmul_like": 1, "noop_no_outputs": 1, "some_future_op": 1}
    assert s.constants == len(g.constants)
    assert s.weight_bytes == sum(np.asarray(a).nbytes for a in g.constants.values())
    assert s.weight_bytes_by_dtype["bool"] == 6 and s.weight_bytes_by_dtype["float16"] == 18
    assert s.inputs == {"x": "float32[4,3]", "ids": "int64[2]"}
    assert s.format_version == (FORMAT_MAJOR, STATIC_FORMAT_MINOR)
    assert json.loads(json.dumps(s.as_dict()))["nodes"] == 5
    assert "matmul_like" in str(s)


def test_save_replaces_atomically_and_leaves_no_temporary_files(program: Program, tmp_path) -> None:
    path = tmp_path / "m.edgr"
    program.save(path)
    old = Program.read(path)
    old_bytes = old.graph.constants["w_f32"].tobytes()
    g = build_sample_graph()
    g.constants["w_f32"] = g.constants["w_f32"] + 1
    Program(g).save(path)
    assert os.listdir(tmp_path) == ["m.edgr"]
    assert old.graph.constants["w_f32"].tobytes() == old_bytes  # the old map still sees the old file
    assert np.array_equal(Program.read(path).graph.constants["w_f32"], g.constants["w_f32"])


@pytest.mark.parametrize("damage, message", [
    (lambda g: g.nodes[0].attrs.__setitem__("bad", np.float32(1)), "float32"),
    (lambda g: g.nodes[0].attrs.__setitem__("bad", {1: 2}), "non-string key"),
    (lambda g: g.nodes[0].inputs.__setitem__(0, "nowhere"), "undefined value"),
    (lambda g: g.outputs.append("nowhere"), "not defined"),
    (lambda g: g.constants.__setitem__("w_f32", np.zeros((4, 3))), "float64"),
    (lambda g: g.constants.__setitem__("w_f32", np.zeros((3, 4), np.float32)), "spec"),
    (lambda g: g.inputs.append("w_f32"), "defined twice"),
    (lambda g: g.nodes[0].meta.__setitem__("k", 5), "must be a string"),
    (lambda g: g.specs.pop(g.nodes[0].outputs[0]), "no spec"),
])
def test_writer_refuses_graphs_it_could_not_read_back(damage, message: str) -> None:
    g = build_sample_graph()
    damage(g)
    with pytest.raises(ProgramFormatError, match=message):
        Program(g).to_bytes()


def test_writer_refuses_non_json_metadata() -> None:
    with pytest.raises(ProgramFormatError, match="metadata"):
        Program(build_sample_graph(), {"when": object()}).to_bytes()


def test_float64_weights_keep_the_static_format_and_run_in_double(tmp_path) -> None:
    """A float64 weight adds no format feature: the file stays the static minor version, and the weight comes
    back as float64 bits and computes in double precision."""
    from edgerun.program.format import Header
    from edgerun.runtime import load

    g = Graph()
    x = g.add_input("x", TensorSpec((3,), DType.float64))
    w = g.add_constant(np.array([1.0, 1e-300, np.pi]), name="w")
    g.outputs = [g.add_node("add", [x, w], [TensorSpec((3,), DType.float64)], {})[0]]
    path = tmp_path / "double.edgr"
    Program(g).save(path)
    assert Header.unpack(path.read_bytes()[:HEADER_SIZE]).minor == STATIC_FORMAT_MINOR
    loaded = Program.read(path)
    assert loaded.graph.constants["w"].dtype == np.float64
    assert loaded.graph.constants["w"].tobytes() == np.array([1.0, 1e-300, np.pi]).tobytes()
    got = load(loaded, backends=["reference"])(np.array([1e-16, 1e-300, 0.0]))
    np.testing.assert_array_equal(got, np.array([1.0 + 1e-16, 2e-300, np.pi]))  # 1e-300 is 0 in float32


def test_a_reader_without_a_dtype_refuses_it_by_name(monkeypatch) -> None:
    """What a reader from before float64 does with a file that has one (its dtype table lacked it): a
    ProgramFormatError naming the dtype, never a misread."""
    from edgerun.program import graph_codec

    g = Graph()
    g.add_constant(np.zeros(2, np.float64), name="w")
    g.outputs = ["w"]
    data = Program(g).to_bytes()
    old = {d: t for d, t in graph_codec._DTYPES.items()
           if d in ("float32", "float16", "int8", "uint8", "int32", "int64", "bool")}
    monkeypatch.setattr(graph_codec, "_DTYPES", old)
    with pytest.raises(ProgramFormatError, match="unknown dtype 'float64'"):
        Program.from_bytes(data)
