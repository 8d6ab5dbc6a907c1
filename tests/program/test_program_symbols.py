"""Template programs: symbols with bounds and symbolic dimensions survive the file; static files are unchanged."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from program_testkit import build_sample_graph, reseal, split_program

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import sym
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import FORMAT_MAJOR, FORMAT_MINOR, Program
from edgerun.program.format import STATIC_FORMAT_MINOR
from edgerun.program.writer import program_to_bytes

# sha256 of program_to_bytes(build_sample_graph(), {"producer": "test", "n": 1}) written by the 1.1 writer
# before symbolic dimensions existed: a static program must stay byte for byte what it was.
STATIC_SAMPLE_SHA256 = "6412f1ab6136fa1158177992875a564b72b7ed137b03b4106e1633c84d0af1bc"


def template_graph() -> Graph:
    batch, seq = sym("batch"), sym("seq")
    g = Graph(symbols={"batch": (1, 8), "seq": (2, 512)})
    x = g.add_input("x", TensorSpec((batch, seq, 4), DType.float32))
    g.add_constant(np.arange(4, dtype=np.float32), name="w")
    (y,) = g.add_node("reshape", [x], [TensorSpec((batch, seq * 4), DType.float32)],
                      {"shape": [batch, seq * 4], "note": {"nested": [(seq - 2) // 2 + 1, 3]}})
    g.outputs = [y]
    return g


def test_static_program_bytes_are_unchanged() -> None:
    raw = program_to_bytes(build_sample_graph(), {"producer": "test", "n": 1})
    assert hashlib.sha256(raw).hexdigest() == STATIC_SAMPLE_SHA256
    header, document, _ = split_program(raw)
    assert header.minor == STATIC_FORMAT_MINOR and "symbols" not in document["graph"]


def test_template_round_trips_symbols_specs_and_attrs() -> None:
    g = template_graph()
    raw = Program(g, {"producer": "test"}).to_bytes()
    header, document, _ = split_program(raw)
    assert (header.major, header.minor) == (FORMAT_MAJOR, FORMAT_MINOR)
    assert document["graph"]["symbols"] == {"batch": [1, 8], "seq": [2, 512]}
    assert document["graph"]["values"]["x"]["shape"] == [{"sym": "batch"}, {"sym": "seq"}, 4]
    loaded = Program.from_bytes(raw).graph
    assert loaded.symbols == g.symbols
    assert loaded.specs == g.specs
    assert loaded.nodes[0].attrs == {"shape": [sym("batch"), 4 * sym("seq")],
                                     "note": {"nested": [(sym("seq") - 2) // 2 + 1, 3]}}
    assert Program.from_bytes(raw).program_hash() == Program(g).program_hash()
    assert Program(loaded, {"producer": "test"}).to_bytes() == raw


def _edit(raw: bytes, change) -> bytes:
    _, document, data = split_program(raw)
    change(document["graph"])
    return reseal(document, data, minor=FORMAT_MINOR)


@pytest.mark.parametrize("change, message", [
    (lambda g: g["values"]["x"]["shape"].__setitem__(0, {"sym": "nobody"}), "does not declare"),
    (lambda g: g["values"]["x"]["shape"].__setitem__(0, {"sym": "__import__('os')"}), "cannot parse"),
    (lambda g: g["values"]["x"]["shape"].__setitem__(0, {"sym": 3}), "integer or"),
    (lambda g: g["symbols"].__setitem__("seq", [5, 2]), "bounds must be"),
    (lambda g: g["symbols"].__setitem__("seq", [1]), "bounds must be"),
    (lambda g: g["symbols"].__setitem__("9lives", [1, 2]), "invalid symbol name"),
    (lambda g: g["nodes"][0]["attrs"].__setitem__("shape", [{"sym": "ghost"}]), "does not declare"),
    (lambda g: g.pop("symbols"), "must be an integer"),
])
def test_malformed_templates_are_refused(change, message: str) -> None:
    raw = Program(template_graph(), {"producer": "test"}).to_bytes()
    with pytest.raises(ProgramFormatError, match=message):
        Program.from_bytes(_edit(raw, change))
