"""Where an FX node came from: the module path and the user's source line, for error messages and node meta."""

from __future__ import annotations

import os
import re
from typing import Any

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _torch_root() -> str:
    import torch

    return os.path.dirname(torch.__file__)


def module_path(node: Any) -> str:
    """Dotted path of the innermost nn.Module that produced the node, e.g. "encoder.layer.3.attention"."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _type = list(stack.values())[-1]
    return str(path)


def source_line(node: Any) -> str:
    """"file:line" of the innermost frame of the stack trace that lies outside torch itself.

    nn.Linear's own forward lives inside torch; the line the user wants is the one that called it.
    """
    trace = node.meta.get("stack_trace") or ""
    frames = [(m["file"], m["line"]) for m in _FRAME.finditer(trace)]
    if not frames:
        return ""
    root = _torch_root()
    user = [f for f in frames if not f[0].startswith(root)]
    file, line = (user or frames)[-1]
    return f"{file}:{line}"


def node_meta(node: Any) -> dict[str, str]:
    """The meta every IR node emitted for this FX node carries."""
    meta = {"frontend_op": str(node.target)}
    path, src = module_path(node), source_line(node)
    if path:
        meta["module_path"] = path
    if src:
        meta["source"] = src
    return meta
