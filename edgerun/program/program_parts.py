"""Format 1.2's additions to the document: several methods, a default method and program state.

    "graph":          the default method's graph, with "constants": [segment names it uses]
    "methods":        {name: graph} for every other method, each with its own "constants" list
    "default_method": the default method's name ("forward" when absent)
    "state":          {state name: segment name}; the segment holds the state's initial value and gives its
                      dtype and shape

Methods share weights by name: a segment listed by two methods is one constant of both (and the writer
stores identical bytes once anyway). A 1.1 document has none of these keys: its graph is the "forward"
method and every segment is one of its constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgerun.errors import ProgramFormatError, VerificationError
from edgerun.ir.graph import Graph
from edgerun.ir.state import check_against_state
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import check_string
from edgerun.program.format import MAX_VALUES
from edgerun.program.graph_codec import check_keys, decode_graph, encode_graph
from edgerun.program.segment_table import SegmentEntry

DEFAULT_METHOD = "forward"
PARTS_KEYS = ("methods", "default_method", "state")
STATE_SEGMENT_PREFIX = "state:"


@dataclass
class ProgramParts:
    """The methods (graphs) of a program, which is the default, and where each state's initial value is."""

    methods: dict[str, Graph]
    default_method: str = DEFAULT_METHOD
    state_segments: dict[str, str] = field(default_factory=dict)  # state name -> segment name
    constant_names: dict[str, list[str]] = field(default_factory=dict)  # method -> its constants' segments

    def is_plain(self) -> bool:
        """One method called "forward" and no state: exactly what a 1.1 document holds."""
        return list(self.methods) == [DEFAULT_METHOD] and not self.state_segments


def state_segment_name(state: str) -> str:
    return STATE_SEGMENT_PREFIX + state


def encode_parts(parts: ProgramParts, default_graph: dict[str, Any]) -> dict[str, Any]:
    """The 1.2 keys; adds the "constants" list to the default graph's JSON form in place."""
    default_graph["constants"] = list(parts.constant_names[parts.default_method])
    methods = {}
    for name, graph in parts.methods.items():
        if name != parts.default_method:
            methods[name] = {**encode_graph(graph), "constants": list(parts.constant_names[name])}
    return {"methods": methods, "default_method": parts.default_method, "state": dict(parts.state_segments)}


def decode_parts(doc: Mapping[str, Any], entries: list[SegmentEntry], allow_unknown: bool) -> ProgramParts:
    segments = {e.name: e for e in entries}
    if not any(key in doc for key in PARTS_KEYS):  # a 1.1 document
        graph = decode_graph(doc["graph"], segments, allow_unknown)
        return ProgramParts({DEFAULT_METHOD: graph}, constant_names={DEFAULT_METHOD: list(segments)})
    default = check_string(doc.get("default_method", DEFAULT_METHOD), "default_method")
    state_segments = _decode_string_map(doc.get("state", {}), "state")
    for state, segment in state_segments.items():
        if segment not in segments:
            raise ProgramFormatError(f"state {state[:80]!r} names segment {segment[:80]!r}, which is not in the "
                                     "segment table")
    graphs = {default: doc["graph"]}
    methods_doc = doc.get("methods", {})
    if type(methods_doc) is not dict or len(methods_doc) > MAX_VALUES:
        raise ProgramFormatError(f"methods must be a JSON object of at most {MAX_VALUES} entries")
    for name, graph_doc in methods_doc.items():
        check_string(name, "method name")
        if not name or name in graphs:
            raise ProgramFormatError(f"method name {name[:80]!r} is empty or the default method's")
        graphs[name] = graph_doc
    parts = ProgramParts({}, default, state_segments)
    for name, graph_doc in graphs.items():
        what = f"method {name[:80]!r}"
        check_keys(graph_doc, f"{what} graph", ("constants",), allow_unknown=True)
        constants = graph_doc["constants"]
        if type(constants) is not list or len(constants) > MAX_VALUES:
            raise ProgramFormatError(f"{what} constants must be a JSON list of segment names")
        for c in constants:
            if type(c) is not str or c not in segments:
                raise ProgramFormatError(f"{what} lists constant {str(c)[:80]!r}, which is not a segment")
        parts.methods[name] = decode_graph(graph_doc, constants, allow_unknown)
        parts.constant_names[name] = list(constants)
    state_specs = {s: TensorSpec(segments[seg].shape, segments[seg].dtype) for s, seg in state_segments.items()}
    for name, graph in parts.methods.items():
        try:
            check_against_state(graph, state_specs, name)
        except VerificationError as exc:
            raise ProgramFormatError(str(exc)) from None
    return parts


def _decode_string_map(obj: object, what: str) -> dict[str, str]:
    if type(obj) is not dict or len(obj) > MAX_VALUES:
        raise ProgramFormatError(f"{what} must be a JSON object of at most {MAX_VALUES} entries")
    for key, value in obj.items():
        check_string(key, f"{what} key")
        check_string(value, f"{what}[{key[:80]!r}]")
        if not key or not value:
            raise ProgramFormatError(f"{what} has an empty name")
    return obj
