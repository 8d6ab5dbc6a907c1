"""`edgerun import-onnx FILE -o OUT`: import an ONNX model, run the default passes, save a program file."""

from __future__ import annotations

import argparse
from typing import Any

from edgerun.errors import EdgerunError


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,..., got {text!r}")
    try:
        return name, tuple(int(d) for d in dims.split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"dimensions must be integers: {text!r}") from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("import-onnx", help="import an ONNX model into an edgerun program file",
                              description=__doc__)
    p.add_argument("file", help="the .onnx file (external data is read from beside it)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--input-shape", action="append", type=_parse_shape, default=[], metavar="NAME=D0,D1,...",
                   help="pin a dynamic input's shape (repeatable)")
    p.add_argument("--no-optimize", action="store_true", help="save the imported graph without running passes")
    p.set_defaults(func=_import_onnx)


def _import_onnx(args: argparse.Namespace) -> int:
    try:
        from edgerun.frontends.onnx import from_onnx
    except ModuleNotFoundError as exc:
        raise EdgerunError(f"import-onnx needs the onnx package ({exc.name} is missing): "
                           "pip install 'edgerun[onnx]'") from None
    program = from_onnx(args.file, input_shapes=dict(args.input_shape) or None, optimize=not args.no_optimize)
    program.save(args.output)
    g = program.graph
    print(f"wrote {args.output}: {len(g.nodes)} nodes, {len(g.inputs)} inputs, {len(g.outputs)} outputs, "
          f"{g.weight_bytes() / 1e6:.2f} MB of weights")
    return 0
