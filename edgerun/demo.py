"""`make demo`: export real models once, then run them with the numpy-only runtime.

1. all-MiniLM-L6-v2 with its real weights: export from PyTorch, optimise, save one program file.
2. In a fresh process where importing torch raises, load that file and embed real sentences; rank them by
   similarity and compare with torch eager.
3. ResNet-18 on a real-looking image, on the reference backend and with `backends="auto"` (the device
   calibrates once, then places every node): top-5 classes and latency against torch eager.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Edge devices run compiled neural networks without Python.",
    "Phones can execute machine-learning models locally.",
    "How do I bake sourdough bread at home?",
    "A simple recipe for homemade bread.",
]

# Runs in a child process that cannot import torch: the device side of the demo.
_DEVICE_SIDE = textwrap.dedent("""
    import json, sys, time
    sys.modules["torch"] = None  # importing torch now raises ImportError
    import numpy as np
    import edgerun
    program, feeds, out, backends = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    t0 = time.perf_counter()
    model = edgerun.load(program, backends=backends if backends == "auto" else backends.split(","))
    load_s = time.perf_counter() - t0
    data = np.load(feeds)
    n = int(data["count"])
    results, first, again = [], [], []
    for i in range(n):
        args = [data[f"in{i}_{k}"] for k in range(int(data["arity"]))]
        t = time.perf_counter()
        res = model(*args)  # the first call warms up (and specialises a template program to the shape)
        first.append(time.perf_counter() - t)
        t = time.perf_counter()
        model(*args)
        again.append(time.perf_counter() - t)
        results.append(res[0] if isinstance(res, (tuple, list)) else res)
    np.save(out, np.stack(results))
    placed = sorted({p.backend for p in model.partitions})
    print(json.dumps({"load_s": load_s, "first_s": first[0], "median_s": float(np.median(again)),
                      "backends": placed}))
""")


def _step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def _device_run(program: Path, batches: list[tuple[np.ndarray, ...]], work: Path,
                backends: str = "reference") -> tuple[np.ndarray, dict[str, Any]]:
    feeds = work / "feeds.npz"
    arrays: dict[str, np.ndarray] = {f"in{i}_{k}": a for i, b in enumerate(batches) for k, a in enumerate(b)}
    arrays["count"] = np.asarray(len(batches))
    arrays["arity"] = np.asarray(len(batches[0]))
    np.savez(feeds, **arrays)  # type: ignore[arg-type]
    out = work / "out.npy"
    proc = subprocess.run([sys.executable, "-c", _DEVICE_SIDE, str(program), str(feeds), str(out), backends],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"device-side run failed:\n{proc.stderr}")
    return np.load(out), json.loads(proc.stdout.strip().splitlines()[-1])


def _export(name: str, work: Path) -> tuple[Path, Any, tuple[Any, ...]]:
    import edgerun
    import edgerun.zoo

    zm = edgerun.zoo.get(name)
    module = zm.build()
    example = zm.example_inputs()
    t0 = time.perf_counter()
    program = edgerun.export(module, example, name=name)
    path = work / f"{name}.edgerun"
    program.save(path)
    summary = program.summary()
    print(f"exported {name} in {time.perf_counter() - t0:.1f} s -> {path.name}: {summary.nodes} nodes, "
          f"{summary.weight_bytes / 1e6:.1f} MB of weights, {path.stat().st_size / 1e6:.1f} MB file")
    return path, module, example


def minilm(work: Path) -> None:
    import torch

    from edgerun.zoo.minilm import tokenize

    _step("all-MiniLM-L6-v2, real weights: export once (PyTorch side)")
    path, module, _ = _export("minilm_l6", work)
    batches = [tuple(t.numpy() for t in tokenize([s])) for s in SENTENCES]
    with torch.no_grad():
        want = np.concatenate([module(*[torch.from_numpy(a) for a in b]).numpy() for b in batches])

    _step("embed real sentences on the device side (torch cannot be imported there)")
    got, stats = _device_run(path, batches, work)
    got = got.reshape(len(SENTENCES), -1)
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    print(f"load {stats['load_s'] * 1e3:.0f} ms; first call {stats['first_s'] * 1e3:.1f} ms, then "
          f"{stats['median_s'] * 1e3:.1f} ms per sentence (median); "
          f"worst cosine distance to torch eager: {float(np.max(1 - cos)):.2e}")
    sim = got @ got.T
    for i, s in enumerate(SENTENCES):
        j = int(np.argsort(-sim[i])[1])
        print(f"  {s!r:62} nearest: {SENTENCES[j]!r} ({sim[i, j]:.2f})")


def resnet(work: Path) -> None:
    import torch

    _step("ResNet-18 on a real-looking image")
    path, module, example = _export("resnet18", work)
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(5):
            want = module(*example).numpy()
        torch_s = (time.perf_counter() - t) / 5
    batches = [tuple(x.numpy() for x in example)] * 5
    top_torch = np.argsort(-want[0])[:5]
    print(f"torch eager: {torch_s * 1e3:.1f} ms, top-5 classes {top_torch.tolist()}")
    # "auto": the device measures its backends once (cached per machine), then places every node.
    for backends in ("reference", "auto"):
        got, stats = _device_run(path, batches, work, backends)
        rel = float(np.max(np.abs(got[0] - want)) / np.max(np.abs(want)))
        print(f"edgerun backends={backends!r} -> placed on {', '.join(stats['backends'])}: "
              f"{stats['median_s'] * 1e3:.1f} ms, load {stats['load_s'] * 1e3:.0f} ms, "
              f"top-5 {np.argsort(-got[0][0])[:5].tolist()}, max relative error {rel:.1e}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="edgerun-demo-") as tmp:
        work = Path(tmp)
        minilm(work)
        resnet(work)
    print("\ndemo finished: one portable program file per model, run where torch cannot be imported: by numpy "
          "alone on the reference backend, or on the backends the device's own search measured fastest.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
