"""Run one fuzz target under atheris (libFuzzer): `python -m fuzz.run TARGET [libFuzzer flags]`.

The repository's corpus of the target (fuzz/corpus/TARGET) seeds the run, read-only; new inputs go to
`--work DIR` (default: a temporary folder), crashes to DIR/crash-*. Only edgerun's own modules are
instrumented for coverage (numpy, onnx, protobuf are not: their coverage would drown edgerun's).
Examples: `-runs=2000` (the bounded CI run), `-max_total_time=600` (bench/fuzz_long.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import atheris

# The modules whose import starts each target's coverage. atheris selects by top-level package: every
# edgerun module they import while instrumenting is instrumented too, and the GGUF target instruments the
# gguf package, whose reader walks the file's fields and tensor infos: guided by it the fuzzer builds valid
# ones (coverage about 150 with both seeds, where edgerun's modules alone gave 24 with the first).
MODULES = {
    "program_file": ["edgerun.program"],
    "gguf": ["edgerun.llm.gguf_reader", "edgerun.llm.quant_blocks", "gguf.gguf_reader"],
    "onnx_model": ["edgerun.frontends.onnx.loading", "edgerun.frontends.onnx.importer",
                   "edgerun.frontends.onnx.context"],
    "task_package": ["edgerun.fleet.package", "edgerun.fleet.task_schema", "edgerun.fleet.manifest"],
    "remote_wire": ["edgerun.remote.wire"],
    "stream_batch": ["edgerun.stream.cloud", "edgerun.json_limits"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(MODULES))
    parser.add_argument("--work", help="folder for new corpus entries and crash files")
    args, flags = parser.parse_known_args()
    import importlib

    with atheris.instrument_imports(include=MODULES[args.target]):
        for module in MODULES[args.target]:
            importlib.import_module(module)
    from fuzz.targets import CORPUS, TARGETS

    work = Path(args.work or tempfile.mkdtemp(prefix=f"edgerun-fuzz-{args.target}-"))
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    target = TARGETS[args.target]
    seeds = CORPUS / args.target
    atheris.Setup([sys.argv[0], *flags, f"-artifact_prefix={work}/", str(work / "corpus"), str(seeds)],
                  target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
