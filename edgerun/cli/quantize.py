"""`edgerun quantize IN -o OUT --scheme S [--calibration data.npz] [--exclude NAME_OR_OPTYPE ...]`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from edgerun.errors import EdgerunError


def register(subparsers: Any) -> None:
    from edgerun.quantization.flow import GROUP_SIZES, SCHEMES
    from edgerun.quantization.observers import OBSERVERS
    schemes = "; ".join(f"{name}: {why}" for name, (_, _, why) in SCHEMES.items())
    p = subparsers.add_parser("quantize", help="quantize a program file to int8 or int4",
                              description=f"{__doc__} Schemes: {schemes}.")
    p.add_argument("file", help="the float program file")
    p.add_argument("-o", "--output", required=True, help="quantized program file to write")
    p.add_argument("--scheme", required=True, help=f"one of {', '.join(SCHEMES)}")
    p.add_argument("--calibration", help=".npz with one array per program input, leading axis = samples")
    p.add_argument("--exclude", nargs="+", default=[], metavar="NAME_OR_OPTYPE",
                   help="layers (output value, node or source name) or op types to keep in float")
    p.add_argument("--group-size", type=int, default=32, choices=GROUP_SIZES, help="int4 group size")
    p.add_argument("--observer", default="minmax", choices=sorted(OBSERVERS),
                   help="int8-static activation range observer")
    p.add_argument("--reduce-range", action="store_true",
                   help="7-bit int8 weights (what ONNX Runtime needs to be exact on AVX2 machines)")
    p.add_argument("--static-linear", action="store_true",
                   help="int8-static: calibrate linear layers' activations too and keep them integer to a uint8 "
                        "output, ONNX Runtime's QLinearMatMul (default: quantized per call)")
    p.set_defaults(func=_quantize)


def _quantize(args: argparse.Namespace) -> int:
    from edgerun.program import Program
    from edgerun.quantization import quantize_with_report
    if not os.path.exists(args.file):
        raise EdgerunError(f"no program file {args.file!r}")
    program = Program.read(args.file)
    _refuse_requantizing(args.file, program, args.scheme)
    quantized, report = quantize_with_report(program, args.scheme, args.calibration, args.exclude,
                                             args.group_size, args.observer, reduce_range=args.reduce_range,
                                             static_linear=args.static_linear)
    quantized.save(args.output)
    before, after = os.path.getsize(args.file), os.path.getsize(args.output)
    print(report.table())
    print(f"wrote {args.output}: {after / 1e6:.2f} MB ({before / max(after, 1):.1f}x smaller than {before / 1e6:.2f} MB)")
    return 0


# The ops that mark a program as already holding the scheme's integer form: quantizing it again would re-round
# what is left in float (an LLM file's few float layers) and change its output for no gain in size.
_ALREADY = {"int4-weight": ("matmul_int4",), "8da4w": ("matmul_int4",),
            "int8-dynamic": ("dynamic_quantize", "matmul_integer", "conv_integer"),
            "int8-static": ("quantize_linear", "matmul_integer", "conv_integer", "requantize")}


def _refuse_requantizing(path: str, program: Any, scheme: str) -> None:
    counts = program.graph.op_counts()
    found = {op: counts[op] for op in _ALREADY.get(scheme, ()) if counts.get(op)}
    if found:
        held = ", ".join(f"{n} {op}" for op, n in found.items())
        raise EdgerunError(f"{path} is already quantized ({held}): --scheme {scheme} would only re-round its "
                           "remaining float layers; quantize the float program it came from instead")
