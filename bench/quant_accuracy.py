"""int8-static accuracy on the zoo CNNs, and how much of its loss the float model itself would show.

    .venv/bin/python bench/quant_accuracy.py [--models resnet18 resnet50 mobilenet_v2] [--size 224]
                                              [--calibration 32] [--test 32] [--observers minmax percentile]
                                              [--static-linear] [--out NAME.json]

Per model: edgerun's int8-static (reduce_range, as the ONNX Runtime delegate runs it) calibrated on
--calibration natural images, output SQNR against float on --test other images, for each observer; also
the SQNR of the input-dependent part alone (the output minus its mean over the test images: the zoo's
random-init networks give nearly the same logits for every image), and the worst single test image's SQNR
with its output's and its error's norms beside the medians (a large error: a range that misses the image; a
small output under the usual error: a weak response, as ResNet-50's low images are). --static-linear calibrates the linear
layers' inputs too (the default quantizes them per call). Beside it, two float-only measurements of
the model's own sensitivity, with no int8 arithmetic at all: the output SQNR after adding noise of 40 dB
SQNR to the input (8-bit activations inject about that much at every layer), and after rounding the
weights to 7 bits per channel. A model that loses most of its SQNR there cannot keep 25 dB at 8 bits under
any observer. Writes bench/results/quant_accuracy.json (--out).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    r = ref.astype(np.float64)
    return float(10 * np.log10(np.sum(r ** 2) / max(float(np.sum((r - got) ** 2)), 1e-30)))


def float_sensitivity(module: Any, test: np.ndarray) -> dict[str, float]:
    import torch

    x = torch.from_numpy(test)
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ref = module(x).numpy()
        noise = torch.randn(x.shape, generator=rng) * x.std() * 10 ** (-40 / 20)
        noisy = module(x + noise).numpy()
        rounded = copy.deepcopy(module)
        for m in rounded.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                dims = tuple(range(1, m.weight.dim()))
                step = m.weight.abs().amax(dim=dims, keepdim=True) / 63
                m.weight.copy_(torch.round(m.weight / step) * step)
        weights7 = rounded(x).numpy()
    return {"input_noise_40db": sqnr(ref, noisy), "weights_7bit": sqnr(ref, weights7)}


def measure(name: str, size: int, n_cal: int, n_test: int, observers: list[str],
            static_linear: bool = False) -> dict[str, Any]:
    import edgerun
    from edgerun.oracle import interpret
    from edgerun.quantization import quantize_with_report
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image

    module = get(name).build().eval()
    program = edgerun.export(module, (natural_image(size, seed=0),))
    calibration = {program.graph.inputs[0]: natural_image(size, seed=1, batch=n_cal).numpy()[:, None]}
    test = natural_image(size, seed=100, batch=n_test).numpy()
    ref = np.stack([interpret(program.graph, [t[None]])[0] for t in test]).astype(np.float64)
    row: dict[str, Any] = {"model": name, "size": size, **float_sensitivity(module, test)}
    for observer in observers:
        t = time.perf_counter()
        quantized, _ = quantize_with_report(program, "int8-static", calibration, reduce_range=True,
                                            observer=observer, report_samples=0, static_linear=static_linear)
        got = np.stack([interpret(quantized.graph, [t_[None]])[0] for t_ in test])
        mean = ref.mean(axis=0)
        per_image = [sqnr(r, g) for r, g in zip(ref, got)]
        # A low single image is either a large error (a range that misses it) or a small output under the same
        # error as the rest: the norms tell which.
        ref_norm = np.linalg.norm(ref.reshape(len(ref), -1), axis=1)
        noise_norm = np.linalg.norm((ref - got).reshape(len(ref), -1), axis=1)
        worst = int(np.argmin(per_image))
        row[observer] = {"sqnr_db": sqnr(ref, got), "input_dependent_sqnr_db": sqnr(ref - mean, got - mean),
                         "worst_image_sqnr_db": min(per_image), "worst_image": worst,
                         "per_image_sqnr_db": per_image, "output_norm": ref_norm.tolist(),
                         "error_norm": noise_norm.tolist(), "seconds": time.perf_counter() - t}
        print(f"{name} {observer}: worst image {worst}: {per_image[worst]:.1f} dB, its output norm "
              f"{ref_norm[worst]:.3g} (median {np.median(ref_norm):.3g}), error norm {noise_norm[worst]:.3g} "
              f"(median {np.median(noise_norm):.3g})", file=sys.stderr, flush=True)
        print(f"{name} {observer}: {row[observer]['sqnr_db']:.1f} dB", file=sys.stderr, flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--test", type=int, default=32)
    parser.add_argument("--observers", nargs="+", default=["minmax", "percentile"])
    parser.add_argument("--static-linear", action="store_true", help="calibrate linear layers' inputs too")
    parser.add_argument("--out", default="quant_accuracy.json", help="file name under bench/results/")
    args = parser.parse_args()
    rows = [measure(m, args.size, args.calibration, args.test, args.observers, args.static_linear)
            for m in args.models]
    print(f"{'model':14s} {'float: 40 dB input noise':>25s} {'float: 7-bit weights':>21s} "
          + " ".join(f"{'int8 ' + o:>18s} {'(input-dep.)':>12s} {'(worst image)':>13s}" for o in args.observers))
    for r in rows:
        print(f"{r['model']:14s} {r['input_noise_40db']:24.1f}  {r['weights_7bit']:20.1f}  "
              + " ".join(f"{r[o]['sqnr_db']:18.1f} {r[o]['input_dependent_sqnr_db']:12.1f} "
                         f"{r[o]['worst_image_sqnr_db']:13.1f}" for o in args.observers))
    load = os.getloadavg()
    out = RESULTS_DIR / args.out
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "load_average": load, "rows": rows}, indent=1))
    print(f"SQNR in dB on {args.test} held-out images at {args.size}x{args.size}; load average {load[0]:.1f}; "
          f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
