"""`make bench`: run the benchmark scripts one after another; each prints its table and writes its JSON.

    .venv/bin/python bench/run_all.py            # the quick ones (a few minutes)
    .venv/bin/python bench/run_all.py --all      # also the long ones (peers, fleet simulator, full suites)

Run on an otherwise idle machine: every figure in docs/benchmarks.md names the command that produced it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICK = [
    ["dispatch_overhead.py"],
    ["memory_plan.py"],
    ["search_time.py"],
    ["remote_throughput.py"],
    ["stream_triggers.py"],
    ["stream_ipv.py"],
    ["fault_injection.py"],
    ["devtools_overhead.py"],
]
LONG = [
    ["peers.py"],
    ["auto_vs_single.py"],
    ["onnx_conformance.py"],
    ["torch_opdb.py"],
    ["fleet_sim.py", "--devices", "10000", "--db", "sqlite"],
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="also run the long benchmarks")
    args = ap.parse_args()
    failed = []
    for script, *extra in QUICK + (LONG if args.all else []):
        print(f"\n===== bench/{script} {' '.join(extra)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / script), *extra])
        print(f"===== bench/{script}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(script)
    # The results changed: docs/benchmarks.md is their rendering (tests/test_benchmarks_page.py checks it).
    subprocess.call([sys.executable, str(HERE / "benchmarks_page.py")])
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
