"""MNN conversion time: the backend's long-lived converter child against the converter called in this
process (which the backend no longer does: the converter's scratch file in the working directory mixed
weights between processes) and a fresh child per conversion.

    .venv/bin/python bench/mnn_convert.py [--models resnet18 mlp] [--rounds 3]

Each way converts the whole optimised zoo graph --rounds times, interleaved; the first conversion of each
way is cold and reported apart, the rest as a median. Writes bench/results/mnn_convert.json; the load
average is printed beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "mlp"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import _tools

    from edgerun import zoo
    from edgerun.backends import mnn
    from edgerun.frontends.torch import export
    from edgerun.passes.pipeline import optimize

    def convert_args(folder: Path) -> list[str]:
        return ["mnnconvert", "-f", "ONNX", "--modelFile", str(folder / "partition.onnx"), "--MNNModel",
                str(folder / "partition.mnn"), "--bizCode", "edgerun", "--keepInputFormat"]

    def in_process(folder: Path) -> None:
        with mnn._quiet_stdout():
            _tools.mnnconvert(convert_args(folder))

    def child_per_conversion(folder: Path) -> None:
        code = "import sys; sys.path.insert(0, sys.argv[1]); import _tools; _tools.mnnconvert(sys.argv[2:])"
        subprocess.run([sys.executable, "-I", "-c", code, mnn.CONVERTER.converter_dir, *convert_args(folder)],
                       cwd=folder, capture_output=True, check=True)

    def long_lived_child(folder: Path) -> None:
        mnn.CONVERTER.convert(folder, convert_args(folder))

    ways: dict[str, Callable[[Path], None]] = {"long-lived child (backend)": long_lived_child,
                                               "child per conversion": child_per_conversion,
                                               "in process": in_process}
    rows: list[dict[str, Any]] = []
    for name in args.models:
        model = zoo.get(name)
        graph, _ = optimize(export(model.build(), model.example_inputs()).graph)
        onnx_bytes = mnn.onnx_with_weights(graph).SerializeToString()
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, run in ways.items():
                with tempfile.TemporaryDirectory() as tmp:
                    folder = Path(tmp)
                    (folder / "partition.onnx").write_bytes(onnx_bytes)
                    start = time.perf_counter()
                    run(folder)
                    times[way].append(time.perf_counter() - start)
                    assert (folder / "partition.mnn").stat().st_size > 0
        for way, seconds in times.items():
            rows.append({"model": name, "way": way, "first_s": seconds[0],
                         "median_rest_s": statistics.median(seconds[1:]) if len(seconds) > 1 else None})
        mnn.CONVERTER.close()  # the next model's first conversion is cold again for every way
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| model | way | first s | median of the rest s |\n|---|---|---:|---:|")
    for row in rows:
        rest = f"{row['median_rest_s']:.3f}" if row["median_rest_s"] is not None else "-"
        print(f"| {row['model']} | {row['way']} | {row['first_s']:.3f} | {rest} |")
    out = HERE / "results" / "mnn_convert.json"
    out.write_text(json.dumps({"load_average": load, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
