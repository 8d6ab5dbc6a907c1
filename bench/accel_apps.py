"""The seven GPTPU applications on the emulated npu: accuracy (beside the seed's Table 4), wall time against
numpy float64 on one and two BLAS threads, the device model's time, and scaling over 1, 2, 4, 8 devices.

    PYTHONPATH=$PWD .venv/bin/python bench/accel_apps.py [--scale 1.0] [--out bench/results/accel_apps.json]

Sizes are small (a 2-core shared box; --scale multiplies them). Wall times measure the emulator on the CPU;
device-model times are what the seed's Table 1 and ~6 ms/MB transfers say the same instructions would take.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from edgerun.accel import SCALE, Runtime
from edgerun.accel.apps import APP_NAMES, get_app, metrics, run_app

SIZES = {"gemm": 256, "pagerank": 256, "hotspot3d": 64, "lud": 128, "gaussian": 64, "backprop": 256,
         "blackscholes": 64}
DATASETS: list[tuple[str, tuple[float, float] | None]] = [
    ("default", None), ("2^7", (-(2.0**7), 2.0**7)), ("2^15", (-(2.0**15), 2.0**15)), ("2^31", (-(2.0**31), 2.0**31))]
# Table 4 of the seed: MAPE % (default, 2^7, 2^15, 2^31), RMSE % (same order)
SEED_TABLE4 = {
    "backprop": ((0.12, 0.17, 0.10, 0.11), (0.14, 0.17, 0.12, 0.12)),
    "blackscholes": ((0.18, 0.18, 0.18, 0.18), (0.33, 0.33, 0.33, 0.33)),
    "gaussian": ((0.00, 0.00, 0.00, 0.00), (0.00, 0.00, 0.00, 0.00)),
    "gemm": ((0.89, 0.90, 0.90, 0.90), (0.98, 0.91, 0.91, 0.91)),
    "hotspot3d": ((0.50, 0.49, 0.46, 0.46), (0.64, 0.64, 0.59, 0.59)),
    "lud": ((0.00, 0.00, 0.00, 0.00), (0.00, 0.00, 0.00, 0.00)),
    "pagerank": ((0.61, 0.73, 0.73, 0.73), (0.41, 0.91, 0.91, 0.91)),
}


def numpy_time(name: str, size: int, threads: int, repeat: int = 3) -> float:
    app = get_app(name)
    data = app.make(size, np.random.default_rng(0), None)
    times = []
    with threadpool_limits(limits=threads):
        for _ in range(repeat):
            t0 = time.perf_counter()
            app.reference(data)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scale_gemm_mape(size: int, value_range: tuple[float, float] | None) -> float:
    app = get_app("gemm")
    d = app.make(size, np.random.default_rng(0), value_range)
    with Runtime(1) as rt:
        return metrics(rt.gemm(d["a"], d["b"], flags=SCALE), app.reference(d))["mape_percent"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every app's size")
    ap.add_argument("--out", default="bench/results/accel_apps.json")
    args = ap.parse_args()
    sizes = {k: max(8, int(v * args.scale)) for k, v in SIZES.items()}
    out: dict = {"sizes": sizes, "loadavg_start": os.getloadavg()[0]}

    print("## Accuracy (SLICED, 16 bits): ours beside the seed's Table 4; MAPE % / RMSE % (of the reference's range)")
    print("| app | size | " + " | ".join(f"{d} ours | {d} seed" for d, _ in DATASETS) + " |")
    print("|---|---:|" + "---:|---:|" * len(DATASETS))
    acc: dict = {}
    for name in APP_NAMES:
        cells = []
        for i, (label, rng) in enumerate(DATASETS):
            r = run_app(name, sizes[name], value_range=rng)
            acc[f"{name}/{label}"] = r
            seed = SEED_TABLE4[name]
            cells.append(f"{r['mape_percent']:.4f} / {r['rmse_percent']:.4f} | {seed[0][i]:.2f} / {seed[1][i]:.2f}")
        print(f"| {name} | {sizes[name]} | " + " | ".join(cells) + " |")
    out["accuracy"] = acc
    scale = {label: scale_gemm_mape(sizes["gemm"], rng) for label, rng in DATASETS}
    out["gemm_scale_method_mape"] = scale
    print("\nGEMM with the seed's one-pass SCALE rule instead (MAPE %): "
          + ", ".join(f"{k} {v:.2f}" for k, v in scale.items()))

    print("\n## Speed (default dataset, 1 device): emulator wall time, numpy float64, device model")
    print("| app | size | npu wall s | numpy 1 thread s | numpy 2 threads s | wall / numpy(2) | device model s |"
          " instructions |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    speed: dict = {}
    for name in APP_NAMES:
        r = acc[f"{name}/default"]
        n1, n2 = numpy_time(name, sizes[name], 1), numpy_time(name, sizes[name], 2)
        speed[name] = {"wall_s": r["wall_s"], "numpy_1t_s": n1, "numpy_2t_s": n2, "device_model_s": r["device_model_s"]}
        print(f"| {name} | {sizes[name]} | {r['wall_s']:.3f} | {n1:.5f} | {n2:.5f} | {r['wall_s'] / n2:.0f}x | "
              f"{r['device_model_s']:.4f} | {r['instructions']} |")
    out["speed"] = speed

    print("\n## Scaling over emulated devices (default dataset): device model s / wall s")
    counts = (1, 2, 4, 8)
    print("| app | " + " | ".join(f"{k} dev" for k in counts) + " | model speed-up at 8 |")
    print("|---|" + "---:|" * (len(counts) + 1))
    scaling: dict = {}
    for name in APP_NAMES:
        rows = [run_app(name, sizes[name], devices=k) for k in counts]
        scaling[name] = [{"devices": k, "device_model_s": r["device_model_s"], "wall_s": r["wall_s"]}
                         for k, r in zip(counts, rows)]
        cells = [f"{r['device_model_s']:.4f} / {r['wall_s']:.2f}" for r in rows]
        print(f"| {name} | " + " | ".join(cells) + f" | {rows[0]['device_model_s'] / rows[-1]['device_model_s']:.2f}x |")
    out["scaling"] = scaling
    out["loadavg_end"] = os.getloadavg()[0]
    print(f"\nload average at start {out['loadavg_start']:.1f}, at end {out['loadavg_end']:.1f} (shared 2-core box)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
