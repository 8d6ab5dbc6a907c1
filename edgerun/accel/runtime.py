"""The runtime: the seed's operation queue (OPQ) feeding the Tensorizer, its instruction queue (IQ) feeding
one worker thread per emulated device, and device affinity for reused data.

A caller (an OpenCtpu task, or a library routine) puts an operation on the OPQ and blocks until it is done,
so operations inside one task run serially; operations of different tasks are taken in whatever order they
arrive. The Tensorizer thread turns each into instructions and schedules them: instructions that share an
affinity key (the same model tile of the same operation) go to the device that already holds it, the rest
first-come-first-serve to the least loaded device. Workers run in parallel for real: the integer kernels are
BLAS calls that release the GIL.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from edgerun.accel.device import DEVICE_MEMORY_BYTES, Instruction, NpuDevice
from edgerun.accel.quant import SLICED
from edgerun.accel.tensorizer import Plan, plan_operation
from edgerun.errors import EdgerunError

DEFAULT_BITS = 16
AFFINITY_SLACK = 2  # queued instructions a device may lead the least loaded one by and still keep affinity


class Batch:
    """The instructions of one operation in flight: their outputs, and per-device modelled time."""

    def __init__(self, count: int, devices: int) -> None:
        self.outputs: list[np.ndarray | None] = [None] * count
        self.remaining = count
        self.device_s = [0.0] * devices
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()
        if count == 0:
            self.done.set()

    def record(self, index: int, device: int, out: np.ndarray | None, seconds: float,
               error: BaseException | None) -> None:
        with self.lock:
            self.outputs[index] = out
            self.device_s[device] += seconds
            if error is not None and self.error is None:
                self.error = error
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()


class Scheduler:
    """The IQ: per-device queues and worker threads, affinity first, then FCFS to the least loaded device.

    Affinity is the seed's rule (same input, flags and task -> same device) with one guard: when the device
    holding the shared data is more than AFFINITY_SLACK instructions behind the least loaded one, the next
    instruction moves there (copying the shared data once more) instead of waiting."""

    def __init__(self, devices: int, memory_bytes: int = DEVICE_MEMORY_BYTES) -> None:
        if not isinstance(devices, int) or devices < 1:
            raise EdgerunError(f"devices must be a positive integer, got {devices!r}")
        self.devices = [NpuDevice(i, memory_bytes) for i in range(devices)]
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in range(devices)]
        self._pending = [0] * devices
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True, name=f"npu{i}")
                         for i in range(devices)]
        for t in self._threads:
            t.start()

    def submit(self, instructions: list[Instruction]) -> Batch:
        batch = Batch(len(instructions), len(self.devices))
        placed: dict[Hashable, int] = {}  # affinity within this operation (same input, flags, task)
        with self._lock:
            for i, ins in enumerate(instructions):
                free = min(range(len(self.devices)), key=lambda j: self._pending[j])
                d = placed.get(ins.affinity) if ins.affinity is not None else None
                if d is None or self._pending[d] > self._pending[free] + AFFINITY_SLACK:
                    d = free  # first come, first served; a long queue gives its shared data up to an idle device
                    if ins.affinity is not None:
                        placed[ins.affinity] = d
                self._pending[d] += 1
                self._queues[d].put((batch, i, ins))
        return batch

    def _work(self, d: int) -> None:
        dev, q = self.devices[d], self._queues[d]
        while True:
            item = q.get()
            if item is None:
                return
            batch, i, ins = item
            before = dev.model_s
            out, err = None, None
            try:
                out = dev.execute(ins)
            except BaseException as exc:  # handed to the waiting task, which re-raises it
                err = exc
            with self._lock:
                self._pending[d] -= 1
            batch.record(i, d, out, dev.model_s - before, err)

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()


@dataclass
class OpEntry:
    """An OPQ entry: task id, operator, inputs, parameters and the quantization method."""

    task_id: int
    op: str
    flags: str
    inputs: tuple[np.ndarray, ...]
    params: dict[str, Any]
    planned: threading.Event = field(default_factory=threading.Event)
    plan: Plan | None = None
    batch: Batch | None = None
    error: BaseException | None = None


class Runtime:
    """OPQ -> Tensorizer -> IQ -> devices. `run` is the one entry; the rest are named conveniences."""

    def __init__(self, devices: int = 1, *, bits: int = DEFAULT_BITS, memory_bytes: int = DEVICE_MEMORY_BYTES,
                 blas_threads: int | None = 1) -> None:
        self.bits = bits
        # the devices are the parallelism: BLAS's own threads would fight the device workers for the cores
        # (and cost 5-10x on small products when the box is busy). Process-wide while this runtime is open.
        self._blas_limit = threadpool_limits(limits=blas_threads, user_api="blas") if blas_threads else None
        self.scheduler = Scheduler(devices, memory_bytes)
        self.opq: queue.Queue[OpEntry | None] = queue.Queue()
        self.device_model_s = 0.0  # sum over operations of the slowest device's modelled time
        self.tensorize_s = 0.0
        self.operations = 0
        self._count_lock = threading.Lock()
        self._next_key = 0
        self._tensorizer = threading.Thread(target=self._tensorize_loop, daemon=True, name="tensorizer")
        self._tensorizer.start()

    @property
    def devices(self) -> list[NpuDevice]:
        return self.scheduler.devices

    def _tensorize_loop(self) -> None:
        while True:
            entry = self.opq.get()
            if entry is None:
                return
            try:
                t0 = time.perf_counter()
                self._next_key += 1
                entry.plan = plan_operation(entry.op, entry.flags, entry.inputs, entry.params, bits=self.bits,
                                            key=(entry.task_id, self._next_key))
                self.tensorize_s += time.perf_counter() - t0
                entry.batch = self.scheduler.submit(entry.plan.instructions)
            except BaseException as exc:
                entry.error = exc
            entry.planned.set()

    def run(self, op: str, *inputs: np.ndarray, flags: str = SLICED, task_id: int = 0, **params: Any) -> np.ndarray:
        """Run one operator to completion (blocking) and return its float64 result."""
        entry = OpEntry(task_id, op, flags, tuple(inputs), params)
        self.opq.put(entry)
        entry.planned.wait()
        if entry.error is not None:
            raise entry.error
        assert entry.plan is not None and entry.batch is not None
        entry.batch.done.wait()
        if entry.batch.error is not None:
            raise entry.batch.error
        with self._count_lock:
            self.device_model_s += max(entry.batch.device_s)
            self.operations += 1
        return entry.plan.finish(entry.batch.outputs)  # type: ignore[arg-type]

    # named conveniences (the OpenCtpu operators and tpuGemm)
    def gemm(self, a: np.ndarray, b: np.ndarray, *, method: str = "conv2D", flags: str = SLICED) -> np.ndarray:
        return self.run(method, a, b, flags=flags)

    def stencil(self, x: np.ndarray, w: np.ndarray, *, flags: str = SLICED) -> np.ndarray:
        return self.run("conv2D", x, w, flags=flags, mode="stencil")

    def close(self) -> None:
        self.opq.put(None)
        self._tensorizer.join()
        self.scheduler.close()
        if self._blas_limit is not None:
            self._blas_limit.restore_original_limits()
            self._blas_limit = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return {
            "device_model_s": self.device_model_s,
            "instructions": sum(d.instructions for d in self.devices),
            "bytes_in": sum(d.bytes_in for d in self.devices),
            "bytes_out": sum(d.bytes_out for d in self.devices),
            "tensorize_s": self.tensorize_s,
            "per_device_model_s": [d.model_s for d in self.devices],
        }
