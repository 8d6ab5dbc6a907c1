"""The graph section's top-level document: {"metadata": ..., "graph": ..., "segments": [...]}.

Decoding ties the parts together: each segment defines one constant, whose spec in the graph must agree with
the segment's dtype and shape.
"""

from __future__ import annotations

from typing import Any

from edgerun.errors import ProgramFormatError
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import constant_home
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import check_json_value, check_string, to_json_value
from edgerun.program.format import MAX_METADATA_ENTRIES
from edgerun.program.graph_codec import check_keys, decode_graph, encode_graph
from edgerun.program.segment_table import SegmentEntry, decode_segment_table

Metadata = dict[str, Any]


def encode_document(graph: Graph, metadata: Metadata, entries: list[SegmentEntry]) -> dict[str, Any]:
    if type(metadata) is not dict:
        raise ProgramFormatError(f"program metadata must be a dict, got {type(metadata).__name__}")
    return {"metadata": to_json_value(metadata, "metadata"), "graph": encode_graph(graph),
            "segments": [e.to_json() for e in entries]}


def decode_metadata(obj: object) -> Metadata:
    if type(obj) is not dict or len(obj) > MAX_METADATA_ENTRIES:
        raise ProgramFormatError(f"metadata must be a JSON object of at most {MAX_METADATA_ENTRIES} entries")
    for key in obj:
        check_string(key, "metadata key")
    check_json_value(obj, "metadata")
    return obj


def decode_document(obj: object, data_length: int,
                    allow_unknown: bool = False) -> tuple[Graph, Metadata, list[SegmentEntry]]:
    """Validate the whole document; the returned Graph has specs but no constant data yet."""
    doc = check_keys(obj, "graph section", ("metadata", "graph", "segments"), (), allow_unknown)
    metadata = decode_metadata(doc["metadata"])
    entries = decode_segment_table(doc["segments"], data_length, allow_unknown)
    graph = decode_graph(doc["graph"], (e.name for e in entries), allow_unknown)
    for e in entries:
        home = constant_home(graph, e.name)
        assert home is not None  # decode_graph defined every segment in some graph
        spec = home[0].specs[home[1]]
        if spec != TensorSpec(e.shape, e.dtype):
            raise ProgramFormatError(f"segment {e.name[:80]!r} holds {e.dtype.value}{list(e.shape)} but the "
                                     f"graph declares the value as {spec}")
    return graph, metadata, entries
