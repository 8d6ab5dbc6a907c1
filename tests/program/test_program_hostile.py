"""Hostile graph sections with valid checksums: the reader's validation, not the checksum, must refuse them."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from program_testkit import build_sample_graph, reseal, split_program

from edgerun.errors import ProgramFormatError
from edgerun.program import Program
from edgerun.program.format import (
    MAX_ATTRS_PER_NODE,
    MAX_DIM,
    MAX_DOCUMENT_DEPTH,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MAX_NODE_INPUTS,
    MAX_RANK,
)

_RAW = Program(build_sample_graph()).to_bytes()
_HEADER, _DOCUMENT, _DATA = split_program(_RAW)


def _seg(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in doc["segments"] if s["name"] == name)


def _node(doc: dict[str, Any], op: str) -> dict[str, Any]:
    return next(n for n in doc["graph"]["nodes"] if n["op"] == op)


Mutation = Callable[[dict[str, Any]], Any]


class _Replacement:
    """Returned by a mutation that replaces the whole document instead of editing it in place."""

    def __init__(self, document: Any) -> None:
        self.document = document

CASES: list[tuple[str, Mutation, str]] = [
    # wrong types
    ("document is a list", lambda d: _Replacement([d]), "must be a JSON object"),
    ("graph is a string", lambda d: d.update(graph="g"), "graph must be a JSON object"),
    ("op is a number", lambda d: _node(d, "clamp").update(op=7), "op must be a string"),
    ("inputs is a string", lambda d: _node(d, "clamp").update(inputs="x"), "inputs must be a JSON list"),
    ("input name is null", lambda d: _node(d, "clamp")["inputs"].__setitem__(0, None), "must be a string"),
    ("attrs is a list", lambda d: _node(d, "clamp").update(attrs=[1]), "attrs must be a JSON object"),
    ("meta value is a number", lambda d: _node(d, "matmul_like")["meta"].update(source=3), "must be a string"),
    ("metadata is a list", lambda d: d.update(metadata=[]), "metadata must be a JSON object"),
    ("shape is a dict", lambda d: d["graph"]["values"]["x"].update(shape={}), "shape must be a JSON list"),
    ("dim is a bool", lambda d: d["graph"]["values"]["x"].update(shape=[True, 3]), "must be an integer"),
    ("dim is a float", lambda d: d["graph"]["values"]["x"].update(shape=[4.0, 3]), "must be an integer"),
    ("offset is a string", lambda d: _seg(d, "w_f32").update(offset="0"), "must be an integer"),
    ("sha256 is not hex", lambda d: _seg(d, "w_f32").update(sha256="z" * 64), "sha256"),
    ("segment name empty", lambda d: _seg(d, "w_f32").update(name=""), "empty name"),
    # unknown or missing things
    ("unknown dtype", lambda d: d["graph"]["values"]["x"].update(dtype="complex128"), "unknown dtype"),
    ("unknown segment dtype", lambda d: _seg(d, "w_f32").update(dtype="complex64"), "unknown dtype"),
    ("missing key", lambda d: _node(d, "clamp").pop("outputs"), "missing 'outputs'"),
    ("unknown key", lambda d: d["graph"].update(extra=1), "unknown key"),
    ("missing spec", lambda d: d["graph"]["values"].pop("x"), "no spec"),
    # sizes and counts
    ("negative dim", lambda d: d["graph"]["values"]["x"].update(shape=[-1, 3]), "outside"),
    ("huge dim", lambda d: d["graph"]["values"]["x"].update(shape=[MAX_DIM + 1]), "outside"),
    ("rank too high", lambda d: d["graph"]["values"]["x"].update(shape=[1] * (MAX_RANK + 1)), "entries, limit"),
    ("shape product overflows", lambda d: d["graph"]["values"]["x"].update(shape=[MAX_DIM] * 4), "elements"),
    ("segment shape product overflows int64",
     lambda d: _seg(d, "w_f32").update(shape=[2**32, 2**32, 2**32, 0]), "elements"),
    ("segment wraps to the right byte count",  # 2**62 float32s are 2**64 bytes == 0 mod 2**64
     lambda d: _seg(d, "w_empty").update(shape=[2**31, 2**31]), "elements"),
    ("nbytes disagrees with shape", lambda d: _seg(d, "w_f32").update(nbytes=44), "needs 48 bytes"),
    ("huge nbytes", lambda d: _seg(d, "w_f32").update(nbytes=2**62), "outside"),
    ("too many node inputs", lambda d: _node(d, "clamp").update(inputs=["x"] * (MAX_NODE_INPUTS + 1)), "limit"),
    ("too many attrs", lambda d: _node(d, "clamp").update(attrs={f"a{i}": i for i in range(MAX_ATTRS_PER_NODE + 1)}),
     "at most"),
    ("name too long", lambda d: _node(d, "clamp").update(name="n" * (MAX_NAME_LENGTH + 1)), "characters long"),
    ("attrs nested too deeply", lambda d: _node(d, "clamp")["attrs"].update(deep=_nested(MAX_JSON_DEPTH + 2)),
     "nested deeper"),
    ("metadata nested too deeply", lambda d: d["metadata"].update(deep=_nested(MAX_JSON_DEPTH + 2)), "nested deeper"),
    # dangling references and duplicates
    ("dangling node input", lambda d: _node(d, "clamp")["inputs"].__setitem__(0, "ghost"), "undefined value 'ghost'"),
    ("dangling graph output", lambda d: d["graph"]["outputs"].append("ghost"), "'ghost' is not defined"),
    ("empty graph input name", lambda d: d["graph"]["inputs"].append(""), "empty name"),
    ("output defined twice", lambda d: _node(d, "gather").update(outputs=_node(d, "clamp")["outputs"]),
     "defined twice"),
    ("input shadows constant", lambda d: d["graph"]["inputs"].append("w_f32"), "defined twice"),
    ("duplicate graph input", lambda d: d["graph"]["inputs"].append("x"), "defined twice"),
    ("duplicate segment name", lambda d: d["segments"].append(copy.deepcopy(_seg(d, "w_i8"))), "appears twice"),
    ("segment spec mismatch", lambda d: d["graph"]["values"]["w_f32"].update(shape=[3, 4]), "declares"),
    # offsets
    ("offset past the end", lambda d: _seg(d, "w_f32").update(offset=len(_DATA) + 64), "outside"),
    ("segment runs past the end", lambda d: _seg(d, "w_f32").update(offset=len(_DATA) - 32), "outside"),
    ("misaligned offset", lambda d: _seg(d, "w_f32").update(offset=_seg(d, "w_f32")["offset"] + 4),
     "not a multiple of 64"),
    ("overlapping segments", lambda d: _seg(d, "w_i64").update(offset=_seg(d, "w_f32")["offset"]), "overlaps"),
    ("contained segment", lambda d: _seg(d, "w_bool").update(offset=_seg(d, "w_tied")["offset"]), "overlaps"),
]


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("mutate, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_document_is_refused_with_a_clear_message(mutate: Mutation, message: str) -> None:
    document = copy.deepcopy(_DOCUMENT)
    replaced = mutate(document)
    if isinstance(replaced, _Replacement):
        document = replaced.document
    with pytest.raises(ProgramFormatError, match=message):
        Program.from_bytes(reseal(document, _DATA))


@pytest.mark.parametrize("section, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"[" * (MAX_DOCUMENT_DEPTH + 1) + b"]" * (MAX_DOCUMENT_DEPTH + 1), "nested too deeply"),  # json.loads would accept
    (b'["' + b"[" * 100 + b'"]', "graph section must be a JSON object"),  # brackets in strings do not count
    (b"{" * 5_000_000, "JSON containers"),
    (b'{"a":1,"a":2}', "duplicate JSON key 'a'"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),  # a BOM
    (b'{"metadata":{}', "not valid JSON"),
    (b"", "not valid JSON"),
    (b"1" * 5000, "not valid JSON"),  # an integer longer than Python's digit limit
    (b'{"graph":1e999999,"metadata":{},"segments":[]}', "graph must be a JSON object"),
    (b'{"graph":{"inputs":[],"outputs":[],"nodes":[],"values":{}},"metadata":{"\\ud800":1},"segments":[]}',
     "lone surrogate"),
])
def test_hostile_graph_section_bytes_are_refused(section: bytes, message: str) -> None:
    with pytest.raises(ProgramFormatError, match=message):
        Program.from_bytes(reseal(None, b"", graph_section=section))


def test_unknown_ops_and_attrs_load_fine() -> None:
    document = copy.deepcopy(_DOCUMENT)
    _node(document, "clamp").update(op="definitely.not_an_op", attrs={"weird": {"x": [None, True, -1e308]}})
    program = Program.from_bytes(reseal(document, _DATA))
    assert any(n.op == "definitely.not_an_op" for n in program.graph.nodes)


def test_bool_segment_bytes_must_be_zero_or_one() -> None:
    document = copy.deepcopy(_DOCUMENT)
    seg = _seg(document, "w_bool")
    data = bytearray(_DATA)
    data[seg["offset"]] = 2
    seg["sha256"] = hashlib.sha256(data[seg["offset"]:seg["offset"] + seg["nbytes"]]).hexdigest()
    with pytest.raises(ProgramFormatError, match="bytes other than 0 and 1"):
        Program.from_bytes(reseal(document, bytes(data)))


def test_minimal_empty_program_is_valid() -> None:
    section = b'{"graph":{"inputs":[],"nodes":[],"outputs":[],"values":{}},"metadata":{},"segments":[]}'
    program = Program.from_bytes(reseal(None, b"", graph_section=section))
    assert program.graph.nodes == [] and program.graph.constants == {}
