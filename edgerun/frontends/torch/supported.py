"""The ATen ops the PyTorch frontend claims to support: the keys of its handler table.

The conformance run (bench/torch_opdb.py) tests every claimed op against PyTorch's own op samples.
"""

from __future__ import annotations


def supported_aten_ops() -> frozenset[str]:
    """Names like "aten.add.Tensor" (str of the OpOverload) that have a handler."""
    from edgerun.frontends.torch import convert  # noqa: F401  (importing registers every handler)
    from edgerun.frontends.torch.context import HANDLERS

    return frozenset(HANDLERS)


def supported_aten_packets() -> frozenset[str]:
    """The op packets ("aten.add") with at least one supported overload."""
    return frozenset(name.rsplit(".", 1)[0] for name in supported_aten_ops())
