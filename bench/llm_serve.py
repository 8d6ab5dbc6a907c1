"""The LLM server under concurrent clients: aggregate generated tokens/s and time to first token (p50, p99)
at 1, 4, 8 and 16 clients, each client the `openai` package streaming a completion of a 128-token prompt
(its own text, so no client reuses another's cached prefix) to 128 new tokens at temperature 0.

Servers, each in its own process on the same GGUF (SmolLM2-135M-Instruct Q4_1) and the same context:
- edgerun: `edgerun llm serve --batch-size N` (continuous batching over N cache slots; docs/llm.md "The
  server"), N = the number of clients unless `--batch-size` fixes it: one process per concurrency, as for
  llama-server, whose slots are fixed at start too. With `--sequential` also `--batch-size 1` (one request
  at a time) at each concurrency, right after the batched server: the ratio batching gives on the same
  machine and load.
- llama-server: llama.cpp's server with `--parallel N --cont-batching`, measured when `--llama-server BIN`
  names a build of it (from the vendored llama.cpp in the llama-cpp-python source distribution:
  `cmake -B build vendor/llama.cpp -DLLAMA_CURL=OFF && cmake --build build --target llama-server`).
  Without it its rows say "not measured".

    PYTHONPATH=$PWD .venv/bin/python bench/llm_serve.py [--clients 1,4,8,16] [--threads 2]
        [--prompt-tokens 128] [--new-tokens 128] [--batch-size N] [--llama-server BIN]

edgerun's rows also count its model calls in the measured round (prefill chunks and decode steps, from
`/metrics`): how the scheduler spent it, independent of the machine's load.

Writes bench/results/llm_serve.json. On a shared machine read the ratios, with the load average printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from llm import TEXT, gguf_path  # noqa: E402  (the same prompt text and model file as bench/llm.py)

CONTEXT = 1024
SEQUENTIAL = "edgerun --batch-size 1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(kind: str, args: argparse.Namespace, clients: int) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads), "EDGERUN_ORT_THREADS": str(args.threads),
           "PYTHONPATH": str(ROOT)}
    if kind.startswith("edgerun"):
        cmd = [sys.executable, "-m", "edgerun", "llm", "serve", args.gguf, "--port", str(port), "--context",
               str(CONTEXT), "--max-queue", "64",
               "--batch-size", "1" if kind == SEQUENTIAL else str(args.batch_size or clients),
               "--kv-cache-mb", "4096"]
        model = os.path.basename(args.gguf)
    else:
        cmd = [args.llama_server, "-m", args.gguf, "--port", str(port), "-c", str(CONTEXT * clients),
               "--parallel", str(clients), "--cont-batching", "-t", str(args.threads), "-tb", str(args.threads)]
        model = "llama"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{kind} did not start: {(proc.stderr.read() if proc.stderr else '')[-2000:]}")
        time.sleep(0.5)
    return proc, url, model


def prompts(args: argparse.Namespace, n: int) -> list[str]:
    """n prompts of about `prompt_tokens` tokens, each starting at another place of the text."""
    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import checkpoint_tokenizer

    tokenizer = checkpoint_tokenizer(load_checkpoint(args.gguf))
    assert tokenizer is not None
    ids = tokenizer.encode(TEXT * 2)
    return [tokenizer.decode(ids[17 * i:17 * i + args.prompt_tokens]) for i in range(n)]


def one_round(url: str, model: str, texts: list[str], new_tokens: int) -> dict[str, Any]:
    import openai

    results: list[dict[str, float]] = [{} for _ in texts]

    def client(i: int) -> None:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=3600)
        start = time.perf_counter()
        first, tokens = None, 0
        for chunk in api.completions.create(model=model, prompt=texts[i], max_tokens=new_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        results[i] = {"ttft_s": first if first is not None else float("nan"), "tokens": tokens,
                      "end_s": time.perf_counter() - start}

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttfts = sorted(r["ttft_s"] for r in results)
    tokens = sum(int(r["tokens"]) for r in results)
    return {"clients": len(texts), "tokens": tokens, "wall_s": round(wall, 3),
            "tok_s": round(tokens / wall, 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1)}


def model_calls(url: str) -> int:
    """edgerun's model calls so far (prefill chunks and decode steps), from its Prometheus /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return int(next(s.value for family in text_string_to_metric_families(text) for s in family.samples
                    if s.name == "edgerun_llm_model_steps_total"))


def run_server(kind: str, args: argparse.Namespace, counts: list[int], texts: list[str]) -> list[dict[str, Any]]:
    rows = []
    for n in counts:  # the slots are fixed at start: one process per concurrency
        print(f"  {kind}, {n} clients ...", file=sys.stderr, flush=True)
        proc, url, model = start_server(kind, args, n)
        try:
            # Warm: the first request pays one-time costs. Its prompt is none of the measured ones, so neither
            # server's prompt cache holds a measured prompt's prefix.
            one_round(url, model, texts[-1:], 8)
            before = model_calls(url) if kind.startswith("edgerun") else 0
            rows.append(one_round(url, model, texts[:n], args.new_tokens))
            if kind.startswith("edgerun"):  # how the scheduler spent the round: prefill chunks + decode steps
                rows[-1]["model_calls"] = model_calls(url) - before
        finally:
            proc.terminate()
            proc.wait(60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,4,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="edgerun's --batch-size at every concurrency (default: the number of clients)")
    parser.add_argument("--sequential", action="store_true", help="also edgerun with --batch-size 1")
    parser.add_argument("--llama-server", default=None, help="a llama-server binary to measure beside edgerun")
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "llm_serve.json"))
    args = parser.parse_args()
    args.gguf = args.gguf or gguf_path()
    counts = [int(c) for c in args.clients.split(",")]
    texts = prompts(args, max(counts) + 1)  # the last one only warms each server up (see run_server)
    load_before = os.getloadavg()
    # Each concurrency's servers one after the other, so a load that drifts during the run falls on both.
    kinds = ["edgerun", *([SEQUENTIAL] if args.sequential else [])]
    servers: dict[str, Any] = {kind: [] for kind in kinds}
    for n in counts:
        for kind in kinds:
            servers[kind] += run_server(kind, args, [n], texts)
    servers["llama-server"] = run_server("llama-server", args, counts, texts) if args.llama_server else \
        "not measured (no --llama-server)"
    load_after = os.getloadavg()
    print(f"\nSmolLM2-135M-Instruct Q4_1, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, streamed, "
          f"{args.threads} threads; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'server':<24} {'clients':>7} {'tok/s':>8} {'x 1 client':>10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} "
          f"{'model calls':>11}")
    for name, rows in servers.items():
        if isinstance(rows, str):
            print(f"{name:<24} {rows}")
            continue
        single = rows[0]["tok_s"] if rows and rows[0]["clients"] == 1 else None
        for r in rows:
            scale = f"{r['tok_s'] / single:>10.2f}" if single else f"{'':>10}"
            print(f"{name:<24} {r['clients']:>7} {r['tok_s']:>8.1f} {scale} {r['ttft_p50_ms']:>12.0f} "
                  f"{r['ttft_p99_ms']:>12.0f} {r.get('model_calls', ''):>11}")
    if isinstance(servers.get(SEQUENTIAL), list):
        for ours, alone in zip(servers["edgerun"], servers[SEQUENTIAL]):
            print(f"{ours['clients']} clients: batched / one at a time tok/s {ours['tok_s'] / alone['tok_s']:.2f}x")
    if isinstance(servers["llama-server"], list):
        for ours, theirs in zip(servers["edgerun"], servers["llama-server"]):
            print(f"{ours['clients']} clients: edgerun / llama-server tok/s {ours['tok_s'] / theirs['tok_s']:.2f}x")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({
        "machine": platform.platform(), "python": platform.python_version(), "threads": args.threads,
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "context": CONTEXT,
        "edgerun_batch_size": args.batch_size or "the number of clients",
        "load_average_before": load_before, "load_average_after": load_after, "command": " ".join(sys.argv),
        "rows": [{"server": name, **r} for name, rows in servers.items() if isinstance(rows, list) for r in rows],
        "not_measured": {name: rows for name, rows in servers.items() if isinstance(rows, str)}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
