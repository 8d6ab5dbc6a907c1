"""`edgerun calibrate`: measure this device's backends once, for the load-time search (cached per device)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("calibrate", help="measure backend throughputs for backends='auto' (once per device)")
    p.add_argument("--backends", default="",
                   help="comma-separated backends to measure (default: every installed candidate)")
    p.add_argument("--show", action="store_true", help="print the cached figures without measuring")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from edgerun.search import (
        auto_backends,
        calibration_path,
        device_description,
        device_fingerprint,
        load_profiles,
    )

    names = [n.strip() for n in args.backends.split(",") if n.strip()] or None
    backends = auto_backends(names)
    profiles = load_profiles(backends, recalibrate=not args.show)
    if args.json:
        print(json.dumps({"fingerprint": device_fingerprint(), "device": device_description(),
                          "cache": str(calibration_path()),
                          "profiles": {k: asdict(v) for k, v in profiles.items()}}, indent=1))
        return 0
    print(f"device {device_fingerprint()}: {device_description()['cpu']}, {device_description()['cores']} cores")
    print(f"cache  {calibration_path()}")
    print(f"{'backend':12s} {'GEMM GF/s':>10s} {'conv GF/s':>10s} {'elem GF/s':>10s} {'GB/s':>8s} "
          f"{'node us':>8s} {'call us':>8s}")
    for name, p in profiles.items():
        print(f"{name:12s} {p.gemm_flops_per_s / 1e9:10.1f} {p.conv_flops_per_s / 1e9:10.1f} "
              f"{p.elementwise_flops_per_s / 1e9:10.1f} {p.bytes_per_s / 1e9:8.1f} {p.dispatch_s * 1e6:8.2f} "
              f"{p.partition_s * 1e6:8.2f}")
        if p.algorithm_scale:
            scales = ", ".join(f"{k} x{v:.2f}" for k, v in p.algorithm_scale.items())
            print(f"{'':12s} conv algorithms, measured/modelled: {scales}")
    return 0
