"""The graph as a JSON document, and back, checking on the way back that the graph is well formed.

Well formed here means structural: every field has the right type and size, every value is defined once
(a graph input, a constant or one node output), everything referenced is defined, and every defined value
has a spec. What an op means (attribute names, shape rules) is the IR verifier's business, so unknown ops
load fine. The writer runs the same checks on what it is about to write, so a saved program always loads.

Bodies of control-flow nodes (`Graph.subgraphs`, format 1.2) are graphs of the same form under the key
"subgraphs", each listing its own "constants"; their weights sit in the one segment table under qualified
names (ir/subgraphs.py). A graph without bodies encodes exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.subgraphs import QUALIFIER
from edgerun.ir.symbolic import dim_to_json
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.canonical_json import check_json_value, check_string, to_json_value
from edgerun.program.format import (
    MAX_ATTRS_PER_NODE,
    MAX_DIM,
    MAX_ELEMENTS,
    MAX_META_PER_NODE,
    MAX_NODE_INPUTS,
    MAX_NODE_OUTPUTS,
    MAX_NODES,
    MAX_RANK,
    MAX_STRING_LENGTH,
    MAX_VALUES,
)
from edgerun.program.symbols_codec import (
    SYMBOLS_KEY,
    decode_symbolic_attrs,
    decode_symbolic_dim,
    decode_symbols,
    encode_symbols,
)

_DTYPES = {d.value: d for d in DType}
MAX_SUBGRAPH_DEPTH = 8  # bodies inside bodies; real models nest two or three deep


# -- small checkers shared with the segment table -----------------------------------------------------------
def check_keys(obj: object, what: str, required: Iterable[str], optional: Iterable[str] = (),
               allow_unknown: bool = False) -> dict[str, Any]:
    """obj is a dict with every required key; unknown keys only where a newer minor version may add them."""
    if type(obj) is not dict:
        raise ProgramFormatError(f"{what} must be a JSON object, got {type(obj).__name__}")
    required = tuple(required)
    missing = [k for k in required if k not in obj]
    if missing:
        raise ProgramFormatError(f"{what} is missing {', '.join(map(repr, missing))}")
    if not allow_unknown:
        known = set(required) | set(optional)
        unknown = [k for k in obj if k not in known]
        if unknown:
            raise ProgramFormatError(f"{what} has unknown key {unknown[0][:80]!r}")
    return obj


def check_list(obj: object, what: str, max_length: int) -> list[Any]:
    if type(obj) is not list:
        raise ProgramFormatError(f"{what} must be a JSON list, got {type(obj).__name__}")
    if len(obj) > max_length:
        raise ProgramFormatError(f"{what} has {len(obj)} entries, limit {max_length}")
    return obj


def check_int(obj: object, what: str, low: int, high: int) -> int:
    if type(obj) is not int:  # bool is an int subclass in Python; JSON true is not a number
        raise ProgramFormatError(f"{what} must be an integer, got {type(obj).__name__}")
    if not low <= obj <= high:
        raise ProgramFormatError(f"{what} is {obj}, outside [{low}, {high}]")
    return obj


def decode_dtype(obj: object, what: str) -> DType:
    if type(obj) is not str or obj not in _DTYPES:
        raise ProgramFormatError(f"{what}: unknown dtype {str(obj)[:40]!r}, expected one of {sorted(_DTYPES)}")
    return _DTYPES[obj]


def decode_shape(obj: object, what: str, symbols: dict[str, tuple[int, int]] | None = None) -> tuple[int, ...]:
    dims = check_list(obj, f"{what} shape", MAX_RANK)
    numel = 1
    out = []
    for i, d in enumerate(dims):
        if symbols and type(d) is dict:
            out.append(decode_symbolic_dim(d, f"{what} dimension {i}", symbols))
            continue
        numel *= check_int(d, f"{what} dimension {i}", 0, MAX_DIM)
        if numel > MAX_ELEMENTS:
            raise ProgramFormatError(f"{what} shape {dims} has more than {MAX_ELEMENTS} elements")
        out.append(d)
    return tuple(out)


def decode_spec(obj: object, what: str, allow_unknown: bool = False,
                symbols: dict[str, tuple[int, int]] | None = None) -> TensorSpec:
    spec = check_keys(obj, what, ("dtype", "shape"), (), allow_unknown)
    return TensorSpec(decode_shape(spec["shape"], what, symbols), decode_dtype(spec["dtype"], what))


def encode_spec(spec: TensorSpec) -> dict[str, Any]:
    return {"dtype": spec.dtype.value, "shape": [dim_to_json(d) for d in spec.shape]}


# -- graph --------------------------------------------------------------------------------------------------
def encode_graph(graph: Graph) -> dict[str, Any]:
    """The JSON form of everything in a Graph except the constant data (which goes to segments)."""
    nodes = []
    for i, n in enumerate(graph.nodes):
        what = f"node {i} ({n.name or n.op})"
        nodes.append({
            "op": n.op, "name": n.name, "inputs": list(n.inputs), "outputs": list(n.outputs),
            "attrs": to_json_value(n.attrs, f"{what} attrs"), "meta": to_json_value(n.meta, f"{what} meta"),
        })
    doc: dict[str, Any] = {
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "values": {name: encode_spec(spec) for name, spec in graph.specs.items()},
        "nodes": nodes,
    }
    if graph.state_inputs or graph.state_updates:  # format 1.2; absent keys keep stateless graphs as in 1.1
        doc["state_inputs"] = list(graph.state_inputs)
        doc["state_updates"] = dict(graph.state_updates)
    if graph.symbols:  # only templates carry the key, so static graphs encode exactly as before
        doc[SYMBOLS_KEY] = encode_symbols(graph.symbols)
    if graph.subgraphs:  # bodies share the top level's symbols; only graphs with bodies carry the key
        doc["subgraphs"] = {name: {**{k: v for k, v in encode_graph(body).items() if k != SYMBOLS_KEY},
                                   "constants": list(body.constants)}
                            for name, body in graph.subgraphs.items()}
    return doc


def _decode_names(obj: object, what: str, max_length: int, allow_empty: bool = False) -> list[str]:
    names = check_list(obj, what, max_length)
    for i, name in enumerate(names):
        check_string(name, f"{what}[{i}]")
        if not name and not allow_empty:
            raise ProgramFormatError(f"{what}[{i}] is an empty name")
    return names


def _decode_node(obj: object, index: int, allow_unknown: bool) -> Node:
    what = f"node {index}"
    node = check_keys(obj, what, ("op", "inputs", "outputs"), ("name", "attrs", "meta"), allow_unknown)
    op = check_string(node["op"], f"{what} op")
    name = check_string(node.get("name", ""), f"{what} name")
    what = f"node {index} ({name or op})"
    # An empty input name marks an omitted optional input (ONNX's convention); outputs always have names.
    inputs = _decode_names(node["inputs"], f"{what} inputs", MAX_NODE_INPUTS, allow_empty=True)
    outputs = _decode_names(node["outputs"], f"{what} outputs", MAX_NODE_OUTPUTS)
    attrs = node.get("attrs", {})
    if type(attrs) is not dict or len(attrs) > MAX_ATTRS_PER_NODE:
        raise ProgramFormatError(f"{what} attrs must be a JSON object of at most {MAX_ATTRS_PER_NODE} entries")
    check_json_value(attrs, f"{what} attrs")
    meta = node.get("meta", {})
    if type(meta) is not dict or len(meta) > MAX_META_PER_NODE:
        raise ProgramFormatError(f"{what} meta must be a JSON object of at most {MAX_META_PER_NODE} entries")
    for key, value in meta.items():
        check_string(key, f"{what} meta key")
        check_string(value, f"{what} meta[{key!r}]", MAX_STRING_LENGTH)
    return Node(op, inputs, outputs, attrs, meta, name=name)


def decode_graph(obj: object, constant_names: Iterable[str], allow_unknown: bool = False) -> Graph:
    """Rebuild a Graph (without constant data) from its JSON form, rejecting anything malformed.

    `constant_names`: the segment table's names, bodies' constants under their qualified names.
    """
    return _decode_graph(obj, "graph", set(constant_names), "", allow_unknown, 0, {})[0]


def _decode_graph(obj: object, what: str, segments: set[str], prefix: str, allow_unknown: bool,
                  depth: int, symbols: dict[str, tuple[int, int]]) -> tuple[Graph, set[str]]:
    """The graph, and the qualified names of its bodies' constants (taken from `segments`). Bodies use the
    top level's symbols; only the top level has state (a method's "constants" list is program_parts.py's)."""
    doc = check_keys(obj, what, ("inputs", "outputs", "values", "nodes"),
                     ("subgraphs", "constants") if prefix else
                     ("subgraphs", SYMBOLS_KEY, "state_inputs", "state_updates", "constants"), allow_unknown)
    if not prefix:
        symbols = decode_symbols(doc[SYMBOLS_KEY]) if SYMBOLS_KEY in doc else {}
    subgraphs: dict[str, Graph] = {}
    claimed: set[str] = set()
    if "subgraphs" in doc:
        bodies = doc["subgraphs"]
        if type(bodies) is not dict or len(bodies) > MAX_VALUES or depth >= MAX_SUBGRAPH_DEPTH:
            raise ProgramFormatError(f"{what} subgraphs must be a JSON object of at most {MAX_VALUES} entries, "
                                     f"nested at most {MAX_SUBGRAPH_DEPTH} deep")
        for name, body in bodies.items():
            check_string(name, f"{what} subgraph name")
            subgraphs[name], inner = _decode_graph(body, f"subgraph {name[:80]!r}", segments,
                                                   f"{prefix}{name}{QUALIFIER}", allow_unknown, depth + 1, symbols)
            claimed |= inner
    if prefix:
        own = _decode_names(doc.get("constants", []), f"{what} constants", MAX_VALUES)
        for name in own:
            if prefix + name not in segments:
                raise ProgramFormatError(f"{what} constant {name[:80]!r} has no weight segment "
                                         f"{(prefix + name)[:120]!r}")
        constant_names: Iterable[str] = own
        claimed |= {prefix + name for name in own}
    else:
        constant_names = [n for n in segments if n not in claimed]
    graph = _decode_flat_graph(doc, constant_names, allow_unknown, symbols)
    graph.subgraphs = subgraphs
    return graph, claimed


def _decode_flat_graph(doc: dict[str, Any], constant_names: Iterable[str], allow_unknown: bool,
                       symbols: dict[str, tuple[int, int]]) -> Graph:
    inputs = _decode_names(doc["inputs"], "graph inputs", MAX_VALUES)
    state_inputs = _decode_names(doc.get("state_inputs", []), "graph state_inputs", MAX_VALUES)
    state_updates = doc.get("state_updates", {})
    if type(state_updates) is not dict or len(state_updates) > MAX_VALUES:
        raise ProgramFormatError(f"graph state_updates must be a JSON object of at most {MAX_VALUES} entries")
    for state, value in state_updates.items():
        check_string(state, "state_updates key")
        check_string(value, f"state_updates[{state[:80]!r}]")
    outputs = _decode_names(doc["outputs"], "graph outputs", MAX_VALUES)
    values = doc["values"]
    if type(values) is not dict or len(values) > MAX_VALUES:
        raise ProgramFormatError(f"graph values must be a JSON object of at most {MAX_VALUES} entries")
    specs = {}
    for name, spec in values.items():
        check_string(name, "value name")
        specs[name] = decode_spec(spec, f"value {name[:80]!r}", allow_unknown, symbols)
    nodes = [_decode_node(n, i, allow_unknown) for i, n in enumerate(check_list(doc["nodes"], "graph nodes",
                                                                                  MAX_NODES))]
    if symbols:
        for node in nodes:
            node.attrs = decode_symbolic_attrs(node.attrs, f"node {node.name or node.op} attrs", symbols)

    defined_by: dict[str, str] = {}

    def define(name: str, by: str) -> None:
        if name in defined_by:
            raise ProgramFormatError(f"value {name[:80]!r} is defined twice: by {defined_by[name]} and by {by}")
        if name not in specs:
            raise ProgramFormatError(f"value {name[:80]!r} (defined by {by}) has no spec in graph values")
        defined_by[name] = by

    for name in inputs:
        define(name, "a graph input")
    for name in constant_names:
        define(name, "a weight segment")
    for name in state_inputs:
        define(name, "the program state")
    for i, node in enumerate(nodes):
        for name in node.outputs:
            define(name, f"node {i} ({node.name or node.op})")
    for i, node in enumerate(nodes):
        for name in node.inputs:
            if name and name not in defined_by:
                raise ProgramFormatError(f"node {i} ({node.name or node.op}) uses undefined value {name[:80]!r}")
    for name in outputs:
        if name not in defined_by:
            raise ProgramFormatError(f"graph output {name[:80]!r} is not defined")
    for state, value in state_updates.items():
        if value not in defined_by:
            raise ProgramFormatError(f"the update of state {state[:80]!r} reads undefined value {value[:80]!r}")
    return Graph(inputs=inputs, outputs=outputs, nodes=nodes, specs=specs, state_inputs=state_inputs,
                 state_updates=state_updates, symbols=symbols)
