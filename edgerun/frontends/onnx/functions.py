"""Expanding an ONNX op into the function body its schema defines (the spec's own decomposition)."""

from __future__ import annotations

from typing import Any

from edgerun.frontends.onnx.context import DTYPE_TO_ONNX, ImportContext


def _schema(op_type: str, version: int) -> Any:
    import onnx.defs
    try:
        return onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return None


def has_function(op_type: str, version: int) -> bool:
    s = _schema(op_type, version)
    return bool(s is not None and (s.has_function or s.has_context_dependent_function))


def expand_function(ctx: ImportContext, proto: Any, version: int, prefix: str) -> tuple[list[Any], dict[str, int]]:
    """The body nodes of `proto`'s function, renamed into the caller's value namespace, and their opsets."""
    import onnx
    from onnx import helper

    schema = _schema(proto.op_type, version)
    node = onnx.NodeProto()
    node.CopyFrom(proto)
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value and attr.default_value.name:
            node.attribute.append(attr.default_value)
    fn = onnx.FunctionProto()
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= version] or [schema.since_version]
        fn.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    else:
        types = []
        for name in node.input:
            if not name:
                types.append(onnx.TypeProto().SerializeToString())
                continue
            # ONNX's builders read a symbolic size as a dim_param (its text), as an exporter would write it.
            dims = [d if isinstance(d, int) else str(d) for d in ctx.shape(name)]
            t = helper.make_tensor_type_proto(DTYPE_TO_ONNX[ctx.dtype(name)], dims)
            types.append(t.SerializeToString())
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= version] \
            or [schema.since_version]
        fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(versions), node.SerializeToString(), types))
    rename = {formal: actual for formal, actual in zip(fn.input, node.input)}
    rename.update({formal: "" for formal in list(fn.input)[len(node.input):]})
    rename.update({formal: actual for formal, actual in zip(fn.output, node.output)})
    caller_attrs = {a.name: a for a in node.attribute}

    def name_of(v: str) -> str:
        if not v:
            return ""
        if v not in rename:
            rename[v] = f"{prefix}/{v}"
        return rename[v]

    body = []
    for inner in fn.node:
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        del n.input[:]
        n.input.extend(name_of(i) for i in inner.input)
        del n.output[:]
        n.output.extend(name_of(o) for o in inner.output)
        del n.attribute[:]
        for a in inner.attribute:
            if a.type == onnx.AttributeProto.GRAPH and not a.ref_attr_name:
                g = onnx.AttributeProto()
                g.CopyFrom(a)
                rename_outer_refs(g.g, rename)
                n.attribute.append(g)
                continue
            if a.ref_attr_name:
                if a.ref_attr_name in caller_attrs:
                    ref = onnx.AttributeProto()
                    ref.CopyFrom(caller_attrs[a.ref_attr_name])
                    ref.name = a.name
                    n.attribute.append(ref)
            else:
                n.attribute.append(a)
        n.name = f"{prefix}/{inner.name or inner.op_type}"
        body.append(n)
    opsets = {o.domain or "": int(o.version) for o in fn.opset_import}
    return body, opsets


def rename_outer_refs(graph: Any, rename: dict[str, str]) -> None:
    """Rename a subgraph's reads of the enclosing function's values (names the subgraph does not define)."""
    local = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    for n in graph.node:
        for k, name in enumerate(n.input):
            if name and name not in local and name in rename:
                n.input[k] = rename[name]
        for a in n.attribute:
            if a.type == 5:  # GRAPH
                rename_outer_refs(a.g, {k: v for k, v in rename.items() if k not in local})
    for k, out in enumerate(graph.output):
        if out.name not in local and out.name in rename:
            graph.output[k].name = rename[out.name]
