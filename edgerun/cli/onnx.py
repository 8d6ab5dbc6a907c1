"""`edgerun import-onnx FILE -o OUT`: import an ONNX model, run the default passes, save a program file."""

from __future__ import annotations

import argparse
from typing import Any

from edgerun.errors import EdgerunError


def _parse_shape(text: str) -> tuple[str, tuple[Any, ...]]:
    """NAME=D0,D1,...: each D a size (pins it), SYMBOL:MIN:MAX (a symbolic dimension with inclusive bounds) or
    SYMBOL:MIN:MAX:MULTIPLE (sizes that are multiples of MULTIPLE)."""
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,..., got {text!r}")
    out: list[Any] = []
    for d in (d.strip() for d in dims.split(",") if d.strip()):
        parts = d.split(":")
        try:
            if len(parts) not in (1, 3, 4):
                raise ValueError
            out.append(int(d) if len(parts) == 1 else (parts[0], *(int(p) for p in parts[1:])))
        except ValueError:
            raise argparse.ArgumentTypeError(f"dimension {d!r} of {text!r} must be a size (224) or a bounded "
                                             "symbol SYMBOL:MIN:MAX (H:32:2048), optionally :MULTIPLE") from None
    return name, tuple(out)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("import-onnx", help="import an ONNX model into an edgerun program file",
                              description=__doc__)
    p.add_argument("file", help="the .onnx file (external data is read from beside it)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--input-shape", action="append", type=_parse_shape, default=[], metavar="NAME=D0,D1,...",
                   help="size an input's dynamic dimensions, for one plan checked upfront (repeatable; none "
                        "needed): each D a size that pins it or "
                        "SYMBOL:MIN:MAX[:MULTIPLE] that keeps it symbolic within bounds, e.g. "
                        "x=1,3,H:32:2048,W:32:2048")
    p.add_argument("--require-shapes", action="store_true",
                   help="refuse a dynamic dimension no --input-shape sizes (by default it imports as a symbol of "
                        "any size, the program specialised at each new size)")
    p.add_argument("--no-optimize", action="store_true", help="save the imported graph without running passes")
    p.set_defaults(func=_import_onnx)


def _import_onnx(args: argparse.Namespace) -> int:
    try:
        from edgerun.frontends.onnx import from_onnx
    except ModuleNotFoundError as exc:
        raise EdgerunError(f"import-onnx needs the onnx package ({exc.name} is missing): "
                           "pip install 'edgerun[onnx]'") from None
    from edgerun.frontends.onnx.symbols import DynamicInputError, InputShapeError

    try:
        program = from_onnx(args.file, input_shapes=dict(args.input_shape) or None, optimize=not args.no_optimize,
                            unsized="refuse" if args.require_shapes else "symbols")
    except (DynamicInputError, InputShapeError) as exc:  # said in flags, not in from_onnx's arguments
        raise EdgerunError(f"{args.file}: {exc.cli_message()}") from None
    program.save(args.output)
    g = program.graph
    symbols = "".join(f", {name} in [{lo}, {hi}]" for name, (lo, hi) in sorted(g.symbols.items()))
    print(f"wrote {args.output}: {len(g.nodes)} nodes, {len(g.inputs)} inputs, {len(g.outputs)} outputs, "
          f"{g.weight_bytes() / 1e6:.2f} MB of weights{symbols}")
    return 0
