"""`edgerun accel app NAME --size N [--devices K] [--range LO,HI] [--seed S] [--json OUT]`: run one of the
seven GPTPU applications on the emulated 8-bit npu and compare it with numpy float64."""

from __future__ import annotations

import argparse
import json
from typing import Any

from edgerun.errors import EdgerunError


def register(subparsers: Any) -> None:
    accel = subparsers.add_parser("accel", help="general-purpose computing on the emulated 8-bit npu (GPTPU)")
    asub = accel.add_subparsers(dest="accel_command", metavar="COMMAND", required=True)
    p = asub.add_parser("app", help="run one application against its float64 reference",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="gemm, pagerank, hotspot3d, lud, gaussian, backprop or blackscholes")
    p.add_argument("--size", type=int, required=True, help="problem size (matrix side; size^2 options for "
                   "blackscholes)")
    p.add_argument("--devices", type=int, default=1, help="emulated npus, one worker thread each (default 1)")
    p.add_argument("--range", dest="value_range", help="random data in [LO, HI) instead of the default dataset; "
                   "write --range=LO,HI when LO is negative (powers allowed: --range=-2^31,2^31)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_out", help="also write the result as JSON to this file")
    p.set_defaults(func=_app)


def parse_range(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    parts = text.split(",")
    try:
        lo, hi = (float(eval_power(x)) for x in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None:
        raise EdgerunError(f"--range wants LO,HI (numbers, or powers like -2^31), got {text!r}")
    return lo, hi


def eval_power(text: str) -> float:
    """'-2^31' -> -2147483648.0; plain numbers pass through."""
    t = text.strip()
    if "^" in t:
        sign = -1.0 if t.startswith("-") else 1.0
        base, exp = t.lstrip("+-").split("^", 1)
        return sign * float(base) ** float(exp)
    return float(t)


def _app(args: argparse.Namespace) -> int:
    from edgerun.accel.apps import run_app

    if args.devices < 1:
        raise EdgerunError(f"--devices must be at least 1, got {args.devices}")
    result = run_app(args.name, args.size, devices=args.devices, value_range=parse_range(args.value_range),
                     seed=args.seed)
    print(f"{result['app']} size {result['size']} on {result['devices']} npu(s), data {result['range']}")
    print(f"  MAPE {result['mape_percent']:.4f} %   RMSE {result['rmse_percent']:.4f} % (of the reference's range)")
    print(f"  device model {result['device_model_s']:.4f} s   wall {result['wall_s']:.4f} s   "
          f"numpy float64 {result['numpy_s']:.4f} s   ({result['instructions']} instructions)")
    if args.json_out:
        try:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        except OSError as exc:
            raise EdgerunError(f"cannot write {args.json_out}: {exc.strerror}") from None
    return 0
