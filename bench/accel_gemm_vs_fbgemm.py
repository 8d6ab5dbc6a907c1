"""GEMM on 1024 x 1024 positive integers with maxima 2..128 (the seed's Table 5): our RMSE beside PyTorch's
quantized matmul on the fbgemm engine, both against the exact float64 product. Bench-only (needs torch).

    PYTHONPATH=$PWD .venv/bin/python bench/accel_gemm_vs_fbgemm.py [--size 1024]

fbgemm's inputs are quint8 with a per-tensor scale chosen as a quantization observer would (max / 255, zero
point 0), and its output is quint8 either with the scale that just covers the true product's maximum (the
usual, range-aware 8-bit CPU GEMM path) or with output scale 1 (integers in, integers out, no range handling:
what the seed's overflow failure looks like). Ours is tpuGemm (bit-sliced strided conv2D on the emulated npu). RMSE is normalised by
the reference's range, in percent.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import torch

from edgerun.accel import Runtime
from edgerun.accel.apps import metrics

MAXIMA = (2, 4, 8, 16, 32, 64, 128)
SEED_FBGEMM = (0.00, 0.00, 0.00, 0.00, 0.47, 0.87, 0.97)  # the seed's Table 5 RMSE (fractions)
SEED_TPU = (0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.01)


def fbgemm_matmul(a: np.ndarray, b: np.ndarray, out_scale: float) -> np.ndarray:
    torch.backends.quantized.engine = "fbgemm"
    sa, sb = max(a.max(), 1) / 255.0, max(b.max(), 1) / 255.0
    qa = torch.quantize_per_tensor(torch.from_numpy(a.astype(np.float32)), sa, 0, torch.quint8)
    qb = torch.quantize_per_tensor(torch.from_numpy(b.astype(np.float32)), sb, 0, torch.quint8)
    return torch.ops.quantized.matmul(qa, qb, out_scale, 0).dequantize().numpy().astype(np.float64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--out", default="bench/results/accel_gemm_vs_fbgemm.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*quantized tensor creation.*")
    rng = np.random.default_rng(0)
    rows = []
    print("| max value | fbgemm RMSE % (range-aware) | fbgemm RMSE % (out scale 1) | ours RMSE % | ours MAPE % | "
          "seed fbgemm % | seed TPU % | fbgemm s | ours wall s | ours device model s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, top in enumerate(MAXIMA):
        a = rng.integers(0, top + 1, (args.size, args.size)).astype(np.float64)
        b = rng.integers(0, top + 1, (args.size, args.size)).astype(np.float64)
        ref = a @ b
        t0 = time.perf_counter()
        fb = fbgemm_matmul(a, b, float(ref.max()) / 255.0)
        fb_s = time.perf_counter() - t0
        naive = fbgemm_matmul(a, b, 1.0)
        with Runtime(1) as rt:
            t0 = time.perf_counter()
            ours = rt.gemm(a, b)
            ours_s = time.perf_counter() - t0
            model_s = rt.device_model_s
        m_fb, m_naive, m_ours = metrics(fb, ref), metrics(naive, ref), metrics(ours, ref)
        rows.append({"max": top, "fbgemm": m_fb, "fbgemm_out_scale_1": m_naive, "ours": m_ours, "fbgemm_s": fb_s,
                     "ours_wall_s": ours_s,
                     "ours_device_model_s": model_s})
        print(f"| {top} | {m_fb['rmse_percent']:.3f} | {m_naive['rmse_percent']:.1f} | {m_ours['rmse_percent']:.3f} | {m_ours['mape_percent']:.3f} | "
              f"{SEED_FBGEMM[i] * 100:.0f} | {SEED_TPU[i] * 100:.0f} | {fb_s:.3f} | {ours_s:.2f} | {model_s:.3f} |")
    load = os.getloadavg()[0]
    print(f"size {args.size}; load average {load:.1f} (shared 2-core box)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"size": args.size, "rows": rows, "loadavg": load}, f, indent=1)


if __name__ == "__main__":
    main()
