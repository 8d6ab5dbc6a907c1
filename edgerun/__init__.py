"""edgerun: compile a model once, run it on any platform.

    program = edgerun.export(module, example_args)   # PyTorch -> portable program (needs torch)
    program.save("model.edgerun")
    model = edgerun.load("model.edgerun")             # numpy alone
    outputs = model(*arrays)

The public names are resolved lazily so that `import edgerun` stays light: the runtime never pulls in
torch or onnx.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgerun.errors import (
    BackendUnavailableError,
    EdgerunError,
    ProgramFormatError,
    RemoteError,
    UnsupportedOpError,
    VerificationError,
)

__version__ = "0.1.0"

# public name -> "module:attribute"
_LAZY = {
    "Program": "edgerun.program:Program",
    "export": "edgerun.frontends.torch:export",
    "export_methods": "edgerun.frontends.torch:export_methods",
    "from_onnx": "edgerun.frontends.onnx:from_onnx",
    "quantize": "edgerun.quantization:quantize",
    "load": "edgerun.search:load",
    "connect": "edgerun.remote.client:connect",
    "training": "edgerun.training",  # a subpackage: edgerun.training.trainable(...) after a bare `import edgerun`
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'edgerun' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr) if attr else importlib.import_module(module)
    globals()[name] = value
    return value


__all__ = [
    "BackendUnavailableError",
    "EdgerunError",
    "Program",
    "ProgramFormatError",
    "RemoteError",
    "UnsupportedOpError",
    "VerificationError",
    "__version__",
    "connect",
    "export",
    "export_methods",
    "from_onnx",
    "load",
    "quantize",
    "training",
]
