"""Time one runtime on one prepared model, alone in this process; print one `PEER_RESULT {json}` line.

    python bench/peer_worker.py RUNTIME MODEL WORKDIR --runs 20 --warmup 3 --threads 2

RUNTIME is edgerun | torch | onnxruntime | onnxruntime-nospin | executorch | mnn. Load time covers reading the artefact and
making it runnable, libraries already imported (for edgerun: load(path, backends="auto") with the one-time
calibration already cached, so the search's time is included).
Latency is the median of `runs` timed calls after `warmup` calls, inputs and outputs copied as a user would.
Peak RSS is this process's own VmHWM, so each runtime is measured with nothing else loaded (not ru_maxrss,
which Linux carries across exec: it would be at least the driver's RSS when it started the worker).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from process_memory import peak_rss_mb  # bench/ is this script's directory

Runner = Callable[[], Any]


def _edgerun(base: str, inputs: list[np.ndarray], threads: int) -> Runner:
    from edgerun.search import load

    model = load(f"{base}.edgerun", backends="auto")
    return lambda: model.run(inputs)


def _edgerun_reference(base: str, inputs: list[np.ndarray], threads: int) -> Runner:
    # The numpy reference backend alone: issue 2's baseline (numpy's BLAS gets OPENBLAS_NUM_THREADS).
    from edgerun.runtime import load

    model = load(f"{base}.edgerun", backends=["reference"])
    return lambda: model.run(inputs)


def _torch(base: str, inputs: list[np.ndarray], threads: int) -> Runner:
    import torch

    torch.set_num_threads(threads)
    module = torch.load(f"{base}.torch.pt", weights_only=False).eval()
    args = [torch.from_numpy(a) for a in inputs]

    def run() -> Any:
        with torch.inference_mode():
            return module(*args)
    return run


def _onnxruntime(base: str, inputs: list[np.ndarray], threads: int, spin: bool = True) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(f"{base}.onnx", options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feed)


def _executorch(base: str, inputs: list[np.ndarray], threads: int) -> Runner:
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    portable_lib._unsafe_reset_threadpool(threads)
    program = Runtime.get().load_program(Path(f"{base}.pte"))
    method = program.load_method("forward")
    args = [torch.from_numpy(a) for a in inputs]
    return lambda: method.execute(args)


def _mnn(base: str, inputs: list[np.ndarray], threads: int) -> Runner:
    import MNN

    interpreter = MNN.Interpreter(f"{base}.mnn")
    session = interpreter.createSession({"numThread": threads, "backend": "CPU"})
    feeds = []
    for tensor, array in zip(interpreter.getSessionInputAll(session).values(), _mnn_order(interpreter, session,
                                                                                          inputs)):
        is_float = array.dtype.kind == "f"
        data = array.astype(np.float32 if is_float else np.int32)
        host = MNN.Tensor(list(data.shape), MNN.Halide_Type_Float if is_float else MNN.Halide_Type_Int,
                          data, MNN.Tensor_DimensionType_Caffe)
        feeds.append((tensor, host))

    def run() -> Any:
        for tensor, host in feeds:
            tensor.copyFrom(host)
        interpreter.runSession(session)
        outputs = interpreter.getSessionOutputAll(session)
        return [np.array(t.getNumpyData(), copy=True) for t in outputs.values()]
    return run


def _mnn_order(interpreter: Any, session: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    # MNN keeps inputs by name; torch.onnx.export named them input0, input1, ...
    names = list(interpreter.getSessionInputAll(session))
    return [inputs[int(n.removeprefix("input"))] if n.startswith("input") else inputs[k]
            for k, n in enumerate(names)]


# Imported before the load timer starts: load time is making the model runnable, not importing a library.
# edgerun's delegates import onnx (the ONNX builder) at their first compile: 0.23 s of DIN's 0.40 s load.
PREIMPORT = {"edgerun": ["edgerun.runtime", "edgerun.search", "edgerun.backends.onnxruntime", "onnx"],
             "edgerun-reference": ["edgerun.runtime"],
             "torch": ["torch"], "onnxruntime": ["onnxruntime"], "onnxruntime-nospin": ["onnxruntime"],
             "executorch": ["torch", "executorch.runtime", "executorch.extension.pybindings.portable_lib"],
             "mnn": ["MNN"]}
RUNTIMES: dict[str, Callable[[str, list[np.ndarray], int], Runner]] = {
    "edgerun": _edgerun, "edgerun-reference": _edgerun_reference, "torch": _torch, "onnxruntime": _onnxruntime, "executorch": _executorch, "mnn": _mnn,
    # ORT with its pool threads not spinning, as edgerun's delegate runs it: the fairer ORT baseline on a
    # machine whose cores are shared.
    "onnxruntime-nospin": lambda base, inputs, threads: _onnxruntime(base, inputs, threads, spin=False),
}


def measure(runtime: str, model: str, workdir: Path, runs: int, warmup: int, threads: int) -> dict[str, Any]:
    base = str(workdir / model)
    with np.load(f"{base}.inputs.npz") as data:
        inputs = [np.ascontiguousarray(data[f"arr_{k}"]) for k in range(len(data.files))]
    for module in PREIMPORT[runtime]:
        importlib.import_module(module)
    start = time.perf_counter()
    run = RUNTIMES[runtime](base, inputs, threads)
    load_s = time.perf_counter() - start
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"runtime": runtime, "model": model, "latency_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "runs": runs, "load_ms": load_s * 1e3,
            "peak_rss_mb": peak_rss_mb()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runtime", choices=sorted(RUNTIMES))
    parser.add_argument("model")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        result = measure(args.runtime, args.model, args.workdir, args.runs, args.warmup, args.threads)
    except Exception as exc:
        result = {"runtime": args.runtime, "model": args.model,
                  "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    print("PEER_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
