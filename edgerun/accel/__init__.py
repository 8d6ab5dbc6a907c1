"""General-purpose computing on an emulated 8-bit NN accelerator (the `npu`), after GPTPU (seed 004).

Layers, top down: apps -> gemm / openctpu -> runtime (OPQ, scheduler) -> tensorizer -> quant, device ->
costmodel. See docs/accel.md for what is emulated and how accuracy is kept.
"""

from __future__ import annotations

from edgerun.accel.gemm import gemm
from edgerun.accel.openctpu import SCALE, SLICED, DeviceArray, OpenCtpu
from edgerun.accel.runtime import Runtime

__all__ = ["SCALE", "SLICED", "DeviceArray", "OpenCtpu", "Runtime", "gemm"]
