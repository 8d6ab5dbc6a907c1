"""Peer benchmark: every zoo model on edgerun (backends="auto") against torch eager, ONNX Runtime (on the
torch.onnx.export model), ExecuTorch with XNNPACK and MNN. Each runtime runs alone in its own process.

    .venv/bin/python bench/peers.py [--models mlp din ...] [--runs 20] [--workdir DIR]

2 threads everywhere; latency is the median of --runs timed calls after --warmup calls. With --rounds R
every runtime is measured R times, in a rotated order, and the round with the lowest median counts: on a
shared machine this keeps one runtime from being charged for another process's burst. Prints a table of
latency, ratio to the fastest peer (edgerun excluded from "peer"), peak RSS and load time, and writes
bench/results/peers.json. With an empty $EDGERUN_CACHE_DIR, edgerun's first round is its first load (the
search measures candidates) and later rounds load the cached winner: its row also records both peaks
(`peak_rss_first_load_mb`, `peak_rss_cached_load_mb`). A runtime that fails on a model shows "failed: reason" instead of a number.
Needs requirements-bench.txt (executorch, MNN).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNTIMES = ["edgerun", "torch", "onnxruntime", "onnxruntime-nospin", "executorch", "mnn"]
# What each runtime needs from peer_prepare.py.
ARTEFACT = {"edgerun": "edgerun", "edgerun-reference": "edgerun", "torch": "torch", "onnxruntime": "onnxruntime",
            "onnxruntime-nospin": "onnxruntime", "executorch": "executorch", "mnn": "mnn"}


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "EDGERUN_ORT_THREADS"):
        env[var] = str(threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def prepare(model: str, workdir: Path, env: dict[str, str], reuse: bool) -> dict[str, str]:
    status_file = workdir / f"{model}.prepare.json"
    if not (reuse and status_file.exists()):
        proc = subprocess.run([sys.executable, str(HERE / "peer_prepare.py"), model, str(workdir)], env=env,
                              capture_output=True, text=True, timeout=1800)
        if not status_file.exists():
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            return dict.fromkeys(ARTEFACT.values(), f"prepare failed: {reason}")
    status: dict[str, str] = json.loads(status_file.read_text())
    return status


def run_worker(runtime: str, model: str, workdir: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "peer_worker.py"), runtime, model, str(workdir), "--runs", str(args.runs),
           "--warmup", str(args.warmup), "--threads", str(args.threads)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"runtime": runtime, "model": model, "error": f"timed out after {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("PEER_RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("PEER_RESULT "))
            return result
    reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1][:200]
    return {"runtime": runtime, "model": model, "error": reason}


def calibrate_once(env: dict[str, str]) -> None:
    """The one-time calibration, outside every timed load (it is cached per device)."""
    subprocess.run([sys.executable, "-c", "from edgerun.search import auto_backends, load_profiles; "
                    "load_profiles(auto_backends())"], env=env, check=True)


def format_table(results: list[dict[str, Any]], models: list[str]) -> str:
    lines = ["| model | runtime | latency ms (median) | × fastest peer | peak RSS MB | load ms |",
             "|---|---|---:|---:|---:|---:|"]
    for model in models:
        rows = [r for r in results if r["model"] == model]
        peers = [r["latency_ms"] for r in rows if not r["runtime"].startswith("edgerun") and "latency_ms" in r]
        fastest = min(peers) if peers else None
        for r in rows:
            if "error" in r:
                lines.append(f"| {model} | {r['runtime']} | failed: {r['error']} | | | |")
                continue
            ratio = f"{r['latency_ms'] / fastest:.2f}" if fastest else "-"
            lines.append(f"| {model} | {r['runtime']} | {r['latency_ms']:.3f} | {ratio} | {r['peak_rss_mb']:.0f} "
                         f"| {r['load_ms']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--runtimes", nargs="*", default=RUNTIMES)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--workdir", type=Path, help="where artefacts go (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="reuse artefacts already in --workdir")
    parser.add_argument("--rounds", type=int, default=1, help="measure each runtime this many times (best counts)")
    parser.add_argument("--prepare-only", action="store_true", help="build the artefacts and stop")
    parser.add_argument("--merge", action="store_true",
                        help="keep --out's results for models not run now (a run split over several calls)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peers.json")
    args = parser.parse_args()
    if args.runs < 20:
        parser.error("--runs must be at least 20")
    from edgerun import zoo

    models = args.models or zoo.list_models()
    env = _env(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edgerun-peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    calibrate_once(env)
    load_before = list(os.getloadavg())
    results: list[dict[str, Any]] = []
    if args.merge and args.out.exists():
        results = [r for r in json.loads(args.out.read_text())["results"] if r["model"] not in models]
    for model in models:
        status = prepare(model, workdir, env, args.reuse)
        if args.prepare_only:
            print(f"{model:14s} {status}", file=sys.stderr, flush=True)
            continue
        best: dict[str, dict[str, Any]] = {}
        peaks: dict[str, list[float]] = {}  # each round's peak RSS, in order (edgerun's first load tunes)
        for round_ in range(args.rounds):
            shift = round_ % len(args.runtimes)
            for runtime in args.runtimes[shift:] + args.runtimes[:shift]:
                made = status.get(ARTEFACT[runtime], "not prepared")
                if made != "ok":
                    result: dict[str, Any] = {"runtime": runtime, "model": model, "error": f"export: {made}"}
                else:
                    result = run_worker(runtime, model, workdir, args, env)
                if "peak_rss_mb" in result:
                    peaks.setdefault(runtime, []).append(result["peak_rss_mb"])
                previous = best.get(runtime)
                if previous is None or result.get("latency_ms", float("inf")) < previous.get("latency_ms", float("inf")):
                    best[runtime] = result
                shown = f"{result['latency_ms']:.3f} ms" if "latency_ms" in result else f"failed: {result['error']}"
                print(f"{model:14s} {runtime:12s} round {round_} {shown}", file=sys.stderr, flush=True)
        for runtime, seen in peaks.items():  # edgerun: the first load's peak (it tunes) and a cached load's
            if runtime.startswith("edgerun") and len(seen) > 1 and "latency_ms" in best[runtime]:
                best[runtime].update(peak_rss_first_load_mb=seen[0], peak_rss_cached_load_mb=max(seen[1:]))
        results += [best[r] for r in args.runtimes]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": " ".join(["bench/peers.py", *sys.argv[1:]]), "machine": platform.platform(),
            "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
            "cache_dir": os.environ.get("EDGERUN_CACHE_DIR", "(default)"), "threads": args.threads,
            "runs": args.runs, "warmup": args.warmup, "rounds": args.rounds, "results": results}, indent=1))
    print(format_table(results, sorted({r["model"] for r in results})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
