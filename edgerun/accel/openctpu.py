"""OpenCtpu in Python: the seed's host API (Table 2) over the runtime.

    ctx = OpenCtpu(devices=2)
    a = ctx.create_buffer(ctx.alloc_dimension(64, 64), data_a)
    c = ctx.create_buffer(ctx.alloc_dimension(64, 64))          # an output buffer
    def kernel(x, y, out):
        ctx.invoke_operator("conv2D", SCALE, x, y, out)           # GEMM through strided conv2D
    tid = ctx.enqueue(kernel, a, b, c)
    ctx.wait(tid)                                                 # or ctx.sync()

Tasks run out of order and in parallel (each on its own host thread); operators inside one task run
serially because `invoke_operator` blocks until its operation is done. `ctx.array(x)` wraps data as a
device array with `+ - *` (pair-wise add, sub, mul) and `@` (tpuGemm) overloaded.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.accel.device import DEVICE_MEMORY_BYTES
from edgerun.accel.quant import SCALE, SLICED
from edgerun.accel.runtime import DEFAULT_BITS, Runtime
from edgerun.errors import EdgerunError

__all__ = ["SCALE", "SLICED", "Buffer", "DeviceArray", "Dimension", "OpenCtpu"]


@dataclass(frozen=True)
class Dimension:
    """openctpu_dimension: the shape of a buffer."""

    shape: tuple[int, ...]


@dataclass
class Buffer:
    """openctpu_buffer: host data described by a Dimension; outputs are written into `data`."""

    dim: Dimension
    data: np.ndarray
    flags: int = 0


class OpenCtpu:
    """One OpenCtpu context: a runtime over `devices` emulated npus and a pool of task threads."""

    def __init__(self, devices: int = 1, *, bits: int = DEFAULT_BITS, memory_bytes: int = DEVICE_MEMORY_BYTES,
                 max_tasks: int = 8) -> None:
        self.runtime = Runtime(devices, bits=bits, memory_bytes=memory_bytes)
        self._pool = ThreadPoolExecutor(max_workers=max_tasks, thread_name_prefix="openctpu-task")
        self._tasks: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self._local = threading.local()

    # -- Table 2 ---------------------------------------------------------------------------------------------
    def alloc_dimension(self, *sizes: int) -> Dimension:
        if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes) or len(sizes) > 4:
            raise EdgerunError(f"a dimension is 1 to 4 positive sizes, got {sizes!r}")
        return Dimension(tuple(sizes))

    def create_buffer(self, dim: Dimension, data: np.ndarray | None = None, flags: int = 0) -> Buffer:
        if data is None:
            return Buffer(dim, np.zeros(dim.shape), flags)
        arr = np.array(data, dtype=np.float64)
        if arr.shape != dim.shape:
            raise EdgerunError(f"buffer data of shape {arr.shape} does not match its dimension {dim.shape}")
        return Buffer(dim, arr, flags)

    def enqueue(self, kernel: Callable[..., Any], *args: Any) -> int:
        """Start a task running kernel(*args); returns its task id at once."""
        task_id = next(self._ids)

        def run() -> Any:
            self._local.task_id = task_id
            return kernel(*args)

        self._tasks[task_id] = self._pool.submit(run)
        return task_id

    def invoke_operator(self, op: str, flags: str, *buffers: Buffer, **params: Any) -> Buffer:
        """Run one npu operator: the inputs are buffers[:-1], the last buffer receives the result."""
        if len(buffers) < 2:
            raise EdgerunError(f"invoke_operator({op!r}) needs input buffers and an output buffer")
        *inputs, out = buffers
        result = self.runtime.run(op, *(b.data for b in inputs), flags=flags,
                                  task_id=getattr(self._local, "task_id", 0), **params)
        result = np.asarray(result, dtype=np.float64)
        if result.size != out.data.size:
            raise EdgerunError(f"{op} produced {result.shape}, the output buffer is {out.dim.shape}")
        out.data[...] = result.reshape(out.data.shape)
        return out

    def wait(self, task_id: int) -> Any:
        """Block until the task finishes; re-raises its error."""
        if task_id not in self._tasks:
            raise EdgerunError(f"no task with id {task_id}")
        return self._tasks.pop(task_id).result()

    def sync(self) -> None:
        """Block until every enqueued task finishes."""
        for tid in list(self._tasks):
            self.wait(tid)

    # -- device arrays ----------------------------------------------------------------------------------------
    def array(self, data: np.ndarray, flags: str = SLICED) -> DeviceArray:
        return DeviceArray(self, np.asarray(data, dtype=np.float64), flags)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.runtime.close()

    def __enter__(self) -> OpenCtpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceArray:
    """Data whose arithmetic runs on the npu: + - * are pair-wise add/sub/mul, @ is tpuGemm (conv2D)."""

    def __init__(self, ctx: OpenCtpu, data: np.ndarray, flags: str) -> None:
        self.ctx, self.data, self.flags = ctx, data, flags

    def _run(self, op: str, other: DeviceArray | np.ndarray) -> DeviceArray:
        rhs = other.data if isinstance(other, DeviceArray) else np.asarray(other, dtype=np.float64)
        task = getattr(self.ctx._local, "task_id", 0)
        return DeviceArray(self.ctx, self.ctx.runtime.run(op, self.data, rhs, flags=self.flags, task_id=task),
                           self.flags)

    def __add__(self, other: DeviceArray | np.ndarray) -> DeviceArray:
        return self._run("add", other)

    def __sub__(self, other: DeviceArray | np.ndarray) -> DeviceArray:
        return self._run("sub", other)

    def __mul__(self, other: DeviceArray | np.ndarray) -> DeviceArray:
        return self._run("mul", other)

    def __matmul__(self, other: DeviceArray | np.ndarray) -> DeviceArray:
        return self._run("conv2D", other)

    def numpy(self) -> np.ndarray:
        return self.data.copy()

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape
