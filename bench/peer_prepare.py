"""Build every runtime's artefact for one zoo model, in its own process (so torch never inflates a worker).

    python bench/peer_prepare.py MODEL WORKDIR   -> WORKDIR/MODEL.{edgerun,torch.pt,onnx,pte,mnn,inputs.npz}

Each artefact is made the way that runtime's users make it: edgerun.export (+ the default passes), a pickled
torch module, torch.onnx.export, ExecuTorch's XNNPACK partitioner, and MNN's converter run on the ONNX file
through its Python binding (never the `mnnconvert` console script, which installs packages and reports
usage). A failure is recorded in WORKDIR/MODEL.prepare.json and leaves that peer out, not the whole run.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(name: str, workdir: Path) -> int:
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch

    from edgerun import zoo

    torch.set_num_threads(2)
    model = zoo.get(name)
    module = model.build().eval()
    args = tuple(model.example_inputs())
    base = workdir / name
    np.savez(f"{base}.inputs.npz", *[a.numpy() for a in args])
    status: dict[str, Any] = {}

    def step(label: str, fn: Callable[[], None]) -> None:
        try:
            fn()
            status[label] = "ok"
        except Exception as exc:  # a peer's tool failing is a result, not a crash
            status[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            traceback.print_exc(file=sys.stderr)

    step("edgerun", lambda: _edgerun(module, args, f"{base}.edgerun"))
    step("torch", lambda: torch.save(module, f"{base}.torch.pt"))
    step("onnxruntime", lambda: _onnx(module, args, f"{base}.onnx"))
    step("executorch", lambda: _executorch(module, args, f"{base}.pte"))
    step("mnn", lambda: _mnn(f"{base}.onnx", f"{base}.mnn"))
    Path(f"{base}.prepare.json").write_text(json.dumps(status, indent=1))
    return 0


def _edgerun(module: Any, args: tuple[Any, ...], path: str) -> None:
    from edgerun.frontends.torch import export

    program = export(module, args)
    try:
        from edgerun.passes import optimize
        program.graph, _ = optimize(program.graph)
    except ImportError:
        pass
    program.save(path)


def _onnx(module: Any, args: tuple[Any, ...], path: str) -> None:
    import torch

    names = [f"input{k}" for k in range(len(args))]
    torch.onnx.export(module, args, path, input_names=names, opset_version=17, dynamo=False)


def _executorch(module: Any, args: tuple[Any, ...], path: str) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    exported = torch.export.export(module, args)
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    Path(path).write_bytes(program.buffer)


def _mnn(onnx_path: str, mnn_path: str) -> None:
    import _tools  # MNN's converter binding; importing MNN.tools.mnnconvert would load its usage logger

    if not Path(onnx_path).exists():
        raise RuntimeError("no ONNX file to convert")
    _tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--modelFile", onnx_path, "--MNNModel", mnn_path,
                       "--bizCode", "edgerun-bench"])
    if not Path(mnn_path).exists():
        raise RuntimeError("the MNN converter wrote no model")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
