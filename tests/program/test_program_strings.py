"""String constants in the program file: length-prefixed UTF-8 segments (edgerun/program/string_segment.py)
survive save and load, a malformed string segment is refused naming it, and a reader that does not know the
dtype refuses the file cleanly."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from edgerun.errors import ProgramFormatError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.runtime import load
from tests.program.program_testkit import reseal, split_program

TABLE = np.array([["", "a", "\u00e9t\u00e9"], ["\U0001F600 emoji", "tab\tnew\nline", "x" * 300]], dtype=object)


def _graph() -> Graph:
    """x (string [2, 3]) + a string table, compared with another; a float op beside them; an empty constant."""
    g = Graph()
    g.add_input("x", TensorSpec((2, 3), DType.string))
    g.add_input("f", TensorSpec((3,), DType.float32))
    b = Builder(g)
    table = g.add_constant(TABLE, name="table")
    g.add_constant(np.array([], dtype=object).reshape(0, 2), name="nothing")
    joined = b.emit("string_concat", ["x", table])
    same = b.emit("string_equal", [joined, table])
    g.outputs += [joined, same, b.emit("mul", ["f", b.const(np.float32(2))]), "nothing"]
    return g


def _encoded(strings: np.ndarray) -> bytes:
    return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in strings.reshape(-1))


@pytest.mark.parametrize("mmap", [True, False])
def test_string_constants_round_trip_through_the_file(tmp_path, mmap: bool) -> None:
    program = Program(_graph(), {"producer": "test"})
    path = tmp_path / "strings.edgr"
    program.save(path)
    loaded = Program.read(path, mmap=mmap)
    for name in ("table", "nothing"):
        got = loaded.graph.constants[name]
        assert got.dtype == object and got.shape == program.graph.constants[name].shape
        np.testing.assert_array_equal(got, program.graph.constants[name])
        assert all(type(s) is str for s in got.reshape(-1))
    assert loaded.program_hash() == program.program_hash()
    assert loaded.summary().weight_bytes_by_dtype["string"] == sum(len(s.encode()) for s in TABLE.reshape(-1))
    x = np.array([["p", "", "q"], ["", "r", "s"]], dtype=object)
    f = np.arange(3, dtype=np.float32)
    joined, same, doubled, nothing = load(loaded, backends=["reference"]).run([x, f])
    assert joined.tolist() == [[a + b for a, b in zip(r, t)] for r, t in zip(x.tolist(), TABLE.tolist())]
    assert same.tolist() == [[False, True, False], [True, False, False]]  # where x is ''

    np.testing.assert_array_equal(doubled, f * 2)
    assert nothing.shape == (0, 2) and nothing.dtype == object


def test_a_string_segment_is_length_prefixed_utf8() -> None:
    raw = Program(_graph(), {}).to_bytes()
    _, document, data = split_program(raw)
    (segment,) = [s for s in document["segments"] if s["name"] == "table"]
    want = _encoded(TABLE)
    assert segment["dtype"] == "string" and segment["shape"] == [2, 3] and segment["nbytes"] == len(want)
    assert data[segment["offset"]:segment["offset"] + segment["nbytes"]] == want


def _with_table_bytes(new: bytes) -> bytes:
    """The program with the table's segment replaced by `new` (table and checksums kept consistent)."""
    _, document, data = split_program(Program(_graph(), {}).to_bytes())
    (segment,) = [s for s in document["segments"] if s["name"] == "table"]
    start, end = segment["offset"], segment["offset"] + segment["nbytes"]
    region = data[:start] + bytes(end - start) + data[end:]  # the old bytes zeroed: padding must be zero
    segment["offset"], segment["nbytes"] = len(region), len(new)  # the new ones at the end
    segment["sha256"] = hashlib.sha256(new).hexdigest()
    region += new + bytes(-len(new) % 64)
    return reseal(document, region)


@pytest.mark.parametrize("new, why", [
    (_encoded(TABLE)[:-1], "runs past the segment's end"),
    (_encoded(TABLE) + b"zz", "bytes after the last string"),
    (_encoded(TABLE[:, :2]), "starts past the segment's end"),
    (b"\x00" * 20, "6 strings need at least 24 bytes"),
    (_encoded(TABLE).replace("\u00e9".encode(), b"\xff\xfe", 1), "not UTF-8"),
])
def test_a_malformed_string_segment_is_refused_naming_it(new: bytes, why: str) -> None:
    with pytest.raises(ProgramFormatError, match=f"segment 'table'.*{why}"):
        Program.from_bytes(_with_table_bytes(new))


def test_the_surgery_above_keeps_a_valid_file_valid() -> None:
    loaded = Program.from_bytes(_with_table_bytes(_encoded(TABLE)))
    np.testing.assert_array_equal(loaded.graph.constants["table"], TABLE)


def test_a_reader_that_does_not_know_the_dtype_refuses_the_file() -> None:
    """What a reader from before strings sees: an unknown dtype, refused before any byte is read."""
    _, document, data = split_program(Program(_graph(), {}).to_bytes())
    for segment in document["segments"]:
        if segment["dtype"] == "string":
            segment["dtype"] = "string2"
    with pytest.raises(ProgramFormatError, match="unknown dtype 'string2'"):
        Program.from_bytes(reseal(document, data))


def test_a_constant_holding_a_non_string_is_refused_at_save() -> None:
    g = _graph()
    g.constants["table"] = np.array([["a", 1, "b"], ["c", "d", "e"]], dtype=object)
    with pytest.raises(ProgramFormatError, match="constant 'table' must hold only str"):
        Program(g, {}).to_bytes()
