"""Building a device model from a 2K x 2K matrix: the Tensorizer's direct writer against edgerun's full
export path (torch module -> edgerun.export -> program file), the seed's 1.8 ms against 2.7 s.

    PYTHONPATH=$PWD .venv/bin/python bench/accel_tensorizer.py [--size 2048] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from edgerun.accel.modelfile import write_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench/results/accel_tensorizer.json")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.size, args.size))

    direct = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        write_model(x)
        direct.append(time.perf_counter() - t0)

    import torch

    import edgerun

    full = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(max(1, args.repeat // 2)):
            t0 = time.perf_counter()
            lin = torch.nn.Linear(args.size, args.size, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(x.astype(np.float32)))
            prog = edgerun.export(lin, (torch.zeros(1, args.size),))
            prog.save(os.path.join(tmp, "m.edgerun"))
            full.append(time.perf_counter() - t0)
    from edgerun.accel.quant import SCALE
    from edgerun.accel.tensorizer import plan_operation

    t0 = time.perf_counter()
    plan = plan_operation("conv2D", SCALE, (x, x), {}, bits=16, key=0)
    plan_s = time.perf_counter() - t0
    count = len(plan.instructions)
    d, f = statistics.median(direct), statistics.median(full)
    print(f"| path ({args.size}x{args.size}) | median s | ratio |")
    print("|---|---:|---:|")
    print(f"| Tensorizer: quantize + tile + write model bytes | {d:.4f} | 1 |")
    print(f"| edgerun.export(nn.Linear) + save | {f:.4f} | {f / d:.0f}x |")
    print(f"| Tensorizer: all {count} conv2D instructions of a {args.size}^3 GEMM (SCALE) | {plan_s:.4f} | "
          f"{plan_s / count * 1e3:.2f} ms each |")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"size": args.size, "direct_s": direct, "export_s": full, "plan_s": plan_s, "instructions": count, "loadavg": os.getloadavg()[0]}, fh)


if __name__ == "__main__":
    main()
