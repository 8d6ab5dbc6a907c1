"""The graph section's top-level document: {"metadata": ..., "graph": ..., "segments": [...]}, plus (format
1.2) "methods", "default_method" and "state" (program_parts.py).

Decoding ties the parts together: each segment defines one constant (of every method that lists it), whose
spec in the graph must agree with the segment's dtype and shape.
"""

from __future__ import annotations

from typing import Any

from edgerun.errors import ProgramFormatError
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import constant_home
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import check_json_value, check_string, to_json_value
from edgerun.program.format import MAX_METADATA_ENTRIES
from edgerun.program.graph_codec import check_keys, encode_graph
from edgerun.program.program_parts import PARTS_KEYS, ProgramParts, decode_parts, encode_parts
from edgerun.program.segment_table import SegmentEntry, decode_segment_table

Metadata = dict[str, Any]


def encode_document(graph: Graph, metadata: Metadata, entries: list[SegmentEntry],
                    parts: ProgramParts | None = None) -> dict[str, Any]:
    if type(metadata) is not dict:
        raise ProgramFormatError(f"program metadata must be a dict, got {type(metadata).__name__}")
    doc = {"metadata": to_json_value(metadata, "metadata"), "graph": encode_graph(graph),
           "segments": [e.to_json() for e in entries]}
    if parts is not None and parts.is_plain():
        parts = None
    if parts is not None:  # format 1.2: methods and state (program_parts.py)
        doc.update(encode_parts(parts, doc["graph"]))
    return doc


def decode_metadata(obj: object) -> Metadata:
    if type(obj) is not dict or len(obj) > MAX_METADATA_ENTRIES:
        raise ProgramFormatError(f"metadata must be a JSON object of at most {MAX_METADATA_ENTRIES} entries")
    for key in obj:
        check_string(key, "metadata key")
    check_json_value(obj, "metadata")
    return obj


def decode_document(obj: object, data_length: int,
                    allow_unknown: bool = False) -> tuple[Graph, Metadata, list[SegmentEntry], ProgramParts]:
    """Validate the whole document; the returned graphs have specs but no constant data yet."""
    doc = check_keys(obj, "graph section", ("metadata", "graph", "segments"), PARTS_KEYS, allow_unknown)
    metadata = decode_metadata(doc["metadata"])
    entries = decode_segment_table(doc["segments"], data_length, allow_unknown)
    parts = decode_parts(doc, entries, allow_unknown)
    by_name = {e.name: e for e in entries}
    for method, graph in parts.methods.items():
        for name in parts.constant_names[method]:
            e = by_name[name]
            home = constant_home(graph, name)  # a body's constant has a qualified name (ir/subgraphs.py)
            assert home is not None  # decode_graph defined every segment it was given in some graph
            spec = home[0].specs[home[1]]
            if spec != TensorSpec(e.shape, e.dtype):
                raise ProgramFormatError(f"segment {e.name[:80]!r} holds {e.dtype.value}{list(e.shape)} but "
                                         f"method {method!r} declares the value as {spec}")
    return parts.methods[parts.default_method], metadata, entries, parts
