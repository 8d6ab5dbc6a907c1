"""A calibration taken while the machine was busy corrects itself once it is quiet, with no cache deleted.

From an empty $EDGERUN_CACHE_DIR, two other processes each spin a core while the first `backends="auto"`
load of each model calibrates and tunes; then they stop, and the model is loaded `--loads` more times, each
in a fresh process, as a user's program would be. Every load prints the engines the search chose, whether
its placement came from the cache or was measured, how busy the calibration it used was marked
(edgerun/search/machine_load.py), and its latency as a ratio to ONNX Runtime's own: ONNX Runtime is timed
alone in its own process (bench/peer_worker.py's `onnxruntime`) after every load, the ratio taken to the
median of those.

    .venv/bin/python bench/peers.py --prepare-only --workdir /tmp/peers-work --models resnet50 vit_tiny
    .venv/bin/python bench/calibration_recovery.py --workdir /tmp/peers-work --models resnet50 vit_tiny

Needs an otherwise idle machine: the spinners are the only load it means to measure. Prints one row per
load and writes bench/results/calibration_recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPIN = "while True: pass"


def child(model: str, workdir: Path, runs: int) -> None:
    """One auto load of `model` in this process: prints `RECOVERY {json}`."""
    import numpy as np

    from edgerun.search import load
    from edgerun.search.calibrate import calibration_path
    from edgerun.search.fingerprint import read_json

    base = workdir / model
    with np.load(f"{base}.inputs.npz") as data:
        inputs = [np.ascontiguousarray(data[f"arr_{k}"]) for k in range(len(data.files))]
    program = load(f"{base}.edgerun", backends="auto")
    for _ in range(3):
        program.run(inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        program.run(inputs)
        times.append(time.perf_counter() - start)
    plan: Any = program.search
    calibration = read_json(calibration_path())
    print("RECOVERY " + json.dumps({
        "engines": sorted(set(plan.placement.values())), "source": plan.tuning.get("source", "-"),
        "winner": plan.tuning.get("winner", "(cached)"), "latency_ms": statistics.median(times) * 1e3,
        "calibration_busy": calibration.get("busy", {}) if isinstance(calibration, dict) else {}}), flush=True)


def run_child(model: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", model, "--workdir", str(args.workdir),
                           "--runs", str(args.runs)], env=env, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RECOVERY "):
            result: dict[str, Any] = json.loads(line.removeprefix("RECOVERY "))
            return result
    return {"error": (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:200]}


def ort_latency_ms(model: str, args: argparse.Namespace, env: dict[str, str]) -> float | None:
    proc = subprocess.run([sys.executable, str(HERE / "peer_worker.py"), "onnxruntime", model, str(args.workdir),
                           "--runs", str(args.runs), "--threads", "2"], env=env, capture_output=True, text=True,
                          timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("PEER_RESULT "):
            latency = json.loads(line.removeprefix("PEER_RESULT ")).get("latency_ms")
            return float(latency) if latency is not None else None
    return None


def wait_quiet(timeout_s: float) -> float | None:
    """Wait until other processes use at most machine_load.QUIET of the cores (or timeout): their share."""
    from edgerun.search.machine_load import QUIET, other_cpu_busy

    until = time.monotonic() + timeout_s
    seen = other_cpu_busy(0.5)
    while seen is not None and seen > QUIET and time.monotonic() < until:
        seen = other_cpu_busy(0.5)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["resnet50", "vit_tiny"])
    parser.add_argument("--workdir", type=Path, required=True, help="bench/peers.py --prepare-only's folder")
    parser.add_argument("--loads", type=int, default=4, help="quiet loads after the busy one")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "calibration_recovery.json")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.workdir, args.runs)
        return 0
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "EDGERUN_ORT_THREADS"):
        env[var] = "2"
    env.pop("EDGERUN_PROBE_MACHINE_LOAD", None)
    load_before = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    for model in args.models:
        env["EDGERUN_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgerun-recovery-")  # empty: calibrates busy
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.spinners)]
        try:
            time.sleep(1.0)
            busy = run_child(model, args, env)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        quiet_share = wait_quiet(60.0)
        # ONNX Runtime is timed in its own process after every load, and each load is divided by the median of
        # those: on a small host a process can land in a slower mode (ViT-Tiny: 17 or 23-24 ms from one ORT
        # process to the next), so one ORT measurement would make the ratios move with it.
        loads = [{"load": 0, "machine": f"{args.spinners} spinners", **busy,
                  "onnxruntime_ms": ort_latency_ms(model, args, env)}]
        for k in range(1, args.loads + 1):
            loads.append({"load": k, "machine": "quiet", **run_child(model, args, env),
                          "onnxruntime_ms": ort_latency_ms(model, args, env)})
        ort_times = [row["onnxruntime_ms"] for row in loads if row["onnxruntime_ms"]]
        ort = statistics.median(ort_times) if ort_times else None
        for row in loads:
            ratio = row["latency_ms"] / ort if ort and "latency_ms" in row else None
            row["x_onnxruntime"] = ratio
            shown = (f"{row['latency_ms']:8.3f} ms {ratio:5.2f}x ORT's median (ORT after it {row['onnxruntime_ms']:.3f} ms)"
                     if ratio else row.get("error", "-"))
            print(f"{model:10s} load {row['load']} ({row['machine']:10s}) {','.join(row.get('engines', [])):22s} "
                  f"{row.get('source', '-'):8s} calibration busy {row.get('calibration_busy')} {shown}", flush=True)
        rows.append({"model": model, "onnxruntime_median_ms": ort, "quiet_share_after": quiet_share, "loads": loads})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["bench/calibration_recovery.py", *sys.argv[1:]]),
                                    "machine": platform.platform(), "load_average": load_before,
                                    "load_average_after": list(os.getloadavg()), "results": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
