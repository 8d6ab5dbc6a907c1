"""Format 1.2: several methods sharing weights by name, a default method and program state, round-tripped,
stored once, and refused cleanly when the document's references are broken."""

from __future__ import annotations

import numpy as np
import pytest
from program_testkit import reseal, split_program

from edgerun.errors import ProgramFormatError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import FORMAT_MAJOR, Program

N = 128  # a 64 KiB weight: large next to the graphs, so the file size shows whether it is stored once


def _method(weight: np.ndarray, *, reads_state: bool, writes_state: bool) -> Graph:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((1, N), DType.float32))
    w = g.add_constant(weight, name="w")
    y = b.emit("matmul", [x, w])
    if reads_state:
        g.specs["memory"] = TensorSpec((1, N), DType.float32)
        g.state_inputs.append("memory")
        y = b.binary("add", y, "memory")
    if writes_state:
        g.state_updates["memory"] = y
    g.outputs = [y]
    return g


def _program() -> Program:
    weight = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    return Program.from_methods(
        {"encode": _method(weight, reads_state=False, writes_state=True),
         "decode": _method(weight.copy(), reads_state=True, writes_state=True)},
        default_method="encode", state={"memory": np.zeros((1, N), np.float32)})


def test_methods_and_state_round_trip_and_weights_are_stored_once(tmp_path):
    program = _program()
    path = tmp_path / "two.edgerun"
    program.save(path)
    loaded = Program.read(path)
    assert loaded.file_info is not None and loaded.file_info.format_version == (FORMAT_MAJOR, 2)
    assert list(loaded.methods) == ["encode", "decode"] and loaded.default_method == "encode"
    assert loaded.graph is loaded.methods["encode"]
    assert loaded.methods["decode"].state_inputs == ["memory"]
    assert set(loaded.methods["decode"].state_updates) == {"memory"}
    np.testing.assert_array_equal(loaded.state["memory"], np.zeros((1, N), np.float32))
    # one name, one array: both methods map the same bytes of the file
    assert np.shares_memory(loaded.methods["encode"].constants["w"], loaded.methods["decode"].constants["w"])
    weight_bytes = N * N * 4
    assert path.stat().st_size < weight_bytes + 16 * 1024  # one copy of the weight plus graphs and state
    assert loaded.program_hash() == program.program_hash()


def test_equal_names_with_different_data_are_renamed_apart():
    a = _method(np.ones((N, N), np.float32), reads_state=False, writes_state=False)
    b = _method(np.zeros((N, N), np.float32), reads_state=False, writes_state=False)
    program = Program.from_methods({"forward": a, "other": b})
    assert list(program.methods["other"].constants) == ["w.other"]
    loaded = Program.from_bytes(program.to_bytes())
    np.testing.assert_array_equal(loaded.methods["other"].constants["w.other"], 0)
    np.testing.assert_array_equal(loaded.methods["forward"].constants["w"], 1)


def test_a_plain_program_writes_no_new_keys():
    g = _method(np.ones((N, N), np.float32), reads_state=False, writes_state=False)
    _, document, _ = split_program(Program(g).to_bytes())
    assert set(document) == {"metadata", "graph", "segments"}
    assert not {"constants", "state_inputs", "state_updates"} & set(document["graph"])


@pytest.mark.parametrize("break_it, message", [
    (lambda d: d["state"].update(memory="nowhere"), "names segment 'nowhere'"),
    (lambda d: d["methods"]["decode"]["constants"].append("ghost"), "lists constant 'ghost'"),
    (lambda d: d["methods"]["decode"].pop("constants"), "missing 'constants'"),
    (lambda d: d["methods"]["decode"]["state_inputs"].append("x"), "defined twice"),
    (lambda d: d["methods"]["decode"]["state_updates"].update(memory="ghost"), "undefined value 'ghost'"),
    (lambda d: d["state"].pop("memory"), "program does not have"),
    (lambda d: d["methods"].update(encode=d["methods"]["decode"]), "default method's"),
])
def test_broken_references_are_refused(break_it, message):
    _, document, data = split_program(_program().to_bytes())
    break_it(document)
    with pytest.raises(ProgramFormatError, match=message):
        Program.from_bytes(reseal(document, data))


def test_summary_lists_methods_and_state():
    summary = _program().summary()
    assert list(summary.methods) == ["encode", "decode"] and summary.state == {"memory": f"float32[1,{N}]"}
    assert "reads state ['memory'], writes ['memory']" in summary.methods["decode"]
    assert f"state  memory: float32[1,{N}]" in str(summary)
    assert summary.as_dict()["methods"] == summary.methods
