"""Scheduler (affinity, FCFS, parallel workers), Tensorizer tiling, OpenCtpu tasks and device arrays."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgerun.accel import SCALE, SLICED, OpenCtpu, Runtime
from edgerun.accel.device import Instruction
from edgerun.accel.runtime import Scheduler
from edgerun.accel.tensorizer import plan_operation
from edgerun.errors import EdgerunError


def _relu(key, affinity):
    return Instruction("ReLU", ((key, np.ones((8, 8), np.int8)),), affinity=affinity)


def test_affinity_keeps_shared_data_on_one_device_and_fcfs_spreads_the_rest():
    sched = Scheduler(2)
    try:
        batch = sched.submit([_relu("model", "model") for _ in range(3)])
        batch.done.wait(10)
        assert sorted(d.instructions for d in sched.devices) == [0, 3]  # all three on one device
        assert sum(d.bytes_in for d in sched.devices) == 64  # copied in once
        batch = sched.submit([_relu(f"k{i}", None) for i in range(8)])
        batch.done.wait(10)
        assert min(d.instructions for d in sched.devices) >= 4  # the others spread over both
        assert batch.error is None and all(o is not None for o in batch.outputs)
    finally:
        sched.close()


def test_a_long_queue_gives_shared_data_up_to_an_idle_device():
    sched = Scheduler(2)
    try:
        sched.submit([_relu("m", "m") for _ in range(12)]).done.wait(10)
        per_device = [d.instructions for d in sched.devices]
        assert min(per_device) >= 3  # both worked
        copies = sum(d.bytes_in for d in sched.devices) // 64
        assert copies < 12  # but the shared operand was not copied per instruction
    finally:
        sched.close()


def test_tensorizer_tiles():
    x = np.random.default_rng(0).uniform(-1, 1, (200, 130))
    assert len(plan_operation("add", SLICED, (x, x), {}, bits=16, key=1).instructions) == 4 * 3  # 3 digits
    assert len(plan_operation("mean", SCALE, (x,), {}, bits=16, key=1).instructions) == 4 * 3  # 64x64 tiles
    assert len(plan_operation("tanh", SCALE, (x,), {}, bits=16, key=1).instructions) == 4
    with pytest.raises(EdgerunError, match="unknown quantization"):
        plan_operation("add", "ROUND", (x, x), {}, bits=16, key=1)


def test_reductions_and_elementwise_are_close():
    x = np.random.default_rng(1).uniform(-3, 3, (100, 70))
    with Runtime(2) as rt:
        assert float(rt.run("max", x)) == pytest.approx(x.max(), abs=3 / 127)
        assert float(rt.run("mean", x)) == pytest.approx(x.mean(), abs=3 / 127)
        assert np.abs(rt.run("tanh", x) - np.tanh(x)).max() < 0.02
        relu = rt.run("ReLU", x)
        assert relu.min() >= 0 and np.abs(relu - np.maximum(x, 0)).max() <= 3 / 254 + 1e-12
        assert np.array_equal(rt.run("crop", x, box=(3, 4, 10, 20)), x[3:13, 4:24])
        padded = rt.run("ext", x, shape=(128, 128))
        assert padded.shape == (128, 128) and np.array_equal(padded[:100, :70], x) and not padded[100:].any()
        with pytest.raises(EdgerunError, match="outside"):
            rt.run("crop", x, box=(90, 0, 20, 5))


def test_openctpu_tasks_run_in_parallel_and_out_of_order():
    with OpenCtpu(devices=2) as ctx:
        gate = threading.Event()
        order = []

        def first():
            assert gate.wait(10), "tasks were serialised"
            order.append(1)

        def second():
            order.append(2)
            gate.set()

        t1, t2 = ctx.enqueue(first), ctx.enqueue(second)
        ctx.wait(t1)
        ctx.wait(t2)
        assert order == [2, 1]


def test_openctpu_buffers_kernels_and_errors():
    rng = np.random.default_rng(2)
    a, b = rng.integers(-50, 50, (40, 30)), rng.integers(-50, 50, (30, 20))
    with OpenCtpu(devices=2) as ctx:
        ta = ctx.create_buffer(ctx.alloc_dimension(40, 30), a)
        tb = ctx.create_buffer(ctx.alloc_dimension(30, 20), b)
        tc = ctx.create_buffer(ctx.alloc_dimension(40, 20))
        td = ctx.create_buffer(ctx.alloc_dimension(40, 20))

        def kernel(x, y, out, out2):  # two operators, serial inside the task
            ctx.invoke_operator("conv2D", SLICED, x, y, out)
            ctx.invoke_operator("add", SLICED, out, out, out2)

        ctx.enqueue(kernel, ta, tb, tc, td)
        ctx.sync()
        assert np.array_equal(tc.data, a @ b) and np.array_equal(td.data, 2 * (a @ b))

        bad = ctx.enqueue(lambda: ctx.invoke_operator("softmax", SCALE, ta, tc))
        with pytest.raises(EdgerunError, match="unknown npu operator"):
            ctx.wait(bad)
        with pytest.raises(EdgerunError, match="no task"):
            ctx.wait(999)
        with pytest.raises(EdgerunError, match="does not match"):
            ctx.create_buffer(ctx.alloc_dimension(2, 2), np.ones(3))


def test_device_array_operators():
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-2, 2, (20, 20)), rng.uniform(-2, 2, (20, 20))
    with OpenCtpu() as ctx:
        dx, dy = ctx.array(x), ctx.array(y)
        for got, want in [((dx + dy), x + y), ((dx - dy), x - y), ((dx * dy), x * y), ((dx @ dy), x @ y)]:
            assert np.abs(got.numpy() - want).max() < 1e-3 * max(1.0, np.abs(want).max())
