"""SmolLM2's KV cache as program state against the cache as program inputs, in one process under one load.

  state   the LLM program's `decode` / `prefill` methods: the cache is state, read as views and written with
          update_slice in place (what edgerun.llm runs)
  inputs  the same step graphs with the cache as inputs and the new rows as outputs (step_graph's
          cache="inputs", the WebGPU plan's form); decode passes the program's own input views as the cache
          (no copy in) and writes the new rows on the host, as edgerun.llm did before the state form;
          prefill copies a host cache in per call

Decode steps are interleaved in blocks of 10 (median and 25th percentile in ms); prefill is one chunk of
`--chunk` tokens (median of `--repeat`). Both forms are placed on `--backends` (default onnxruntime).

    .venv/bin/python bench/llm_cache_state.py [--context 512] [--chunk 128] [--blocks 20] [--repeat 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from llm_prefill_shapes import gguf_path  # this folder is on sys.path when run as a script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--backends", default="onnxruntime", help="'auto' or a comma-separated list")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import build_program, load_program, model_info
    from edgerun.llm.program_builder import cache_names, step_graph
    from edgerun.search import load

    backends = args.backends if args.backends == "auto" else args.backends.split(",")
    checkpoint = load_checkpoint(gguf_path())
    info = model_info(checkpoint, args.context, args.chunk)
    config, weights = info.config, dict(checkpoint.weights)
    state = load_program(build_program(checkpoint, info), backends)
    decode_inputs = load(step_graph(config, weights, chunk=1, context=args.context, int8_activations=True,
                                    cache="inputs"), backends=backends)
    prefill_inputs = load(step_graph(config, weights, chunk=args.chunk, context=args.context, cache="inputs"),
                          backends=backends)
    resident = [decode_inputs.parts.views[n] for n in cache_names(config)]
    host = [np.zeros_like(c) for c in resident]
    for cache in resident:
        cache.fill(0)
    token, last = np.array([504]), np.array([0])

    def decode_with_inputs(pos: int) -> None:
        rows = decode_inputs.run([token, np.array([pos]), last, *resident])[1:]
        for i in range(config.layers):
            resident[2 * i][:, :, pos:pos + 1] = rows[2 * i]
            resident[2 * i + 1][:, pos:pos + 1, :] = rows[2 * i + 1]

    def decode_with_state(pos: int) -> None:
        state.method("decode").run([token, np.array([pos]), last])

    tokens = np.arange(args.chunk, dtype=np.int64) + 100
    start, final = np.array([0]), np.array([args.chunk - 1])
    prefills: dict[str, Callable[[], object]] = {
        "inputs": lambda: prefill_inputs.run([tokens, start, final, *host]),
        "state": lambda: state.method("prefill").run([tokens, start, final]),
    }
    decodes = {"inputs": decode_with_inputs, "state": decode_with_state}
    print(f"load average {os.getloadavg()[0]:.1f}; context {args.context}; backends {args.backends}")
    with threadpool_limits(1):
        prefill_s: dict[str, list[float]] = {name: [] for name in prefills}
        for _ in range(args.repeat + 1):
            for name, call in prefills.items():
                t = time.perf_counter()
                call()
                prefill_s[name].append(time.perf_counter() - t)
        decode_s: dict[str, list[float]] = {name: [] for name in decodes}
        for block in range(args.blocks + 1):
            for name, step in decodes.items():
                for pos in range(100, 110):
                    t = time.perf_counter()
                    step(pos)
                    if block:  # the first block warms up
                        decode_s[name].append(time.perf_counter() - t)
    for name in decodes:
        d, p = decode_s[name], prefill_s[name][1:]
        print(f"{name:<7} decode step median {statistics.median(d) * 1e3:.1f} ms (p25 "
              f"{np.percentile(d, 25) * 1e3:.1f}), {args.chunk}-token prefill chunk median "
              f"{statistics.median(p) * 1e3:.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
