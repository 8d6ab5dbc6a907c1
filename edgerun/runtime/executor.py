"""The executor: run an instruction list, with or without a profiling sink."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from edgerun.runtime.instructions import EventSink, Instruction, InstructionEvent


class Executor:
    """Holds the bound calls as a tuple: the unprofiled loop is a bare `for call in calls: call()`."""

    def __init__(self, instructions: Sequence[Instruction]) -> None:
        self.instructions = tuple(instructions)
        self._calls = tuple(i.call for i in self.instructions)
        # Node calls the runtime bound (bind_node) compute with numpy and leave floating-point exceptions to
        # it; a partition's own run quiets its own (CompiledPartition), so delegates alone need no errstate
        # (about 1 us a call, a third of a tiny model's).
        self._binds_kernels = any(i.op != "partition" for i in self.instructions)

    def run(self, sink: EventSink | None = None) -> None:
        if sink is None and not self._binds_kernels:
            for call in self._calls:
                call()
            return
        # Floating-point exceptions are the kernels' business (overflow to inf, 0/0 to NaN, as in every
        # framework); one errstate around the loop replaces one per kernel call.
        with np.errstate(all="ignore"):
            if sink is None:
                for call in self._calls:
                    call()
            else:
                self._run_profiled(sink)

    def unprofiled(self) -> Callable[[], None]:
        """The cheapest call that runs the list without a sink: a lone delegate instruction is its own run."""
        if len(self._calls) == 1 and not self._binds_kernels:
            return self._calls[0]
        return self.run

    def _run_profiled(self, sink: EventSink) -> None:
        clock = time.perf_counter_ns
        for index, instruction in enumerate(self.instructions):
            start = clock()
            instruction.call()
            end = clock()
            sink(InstructionEvent(index, instruction, start, end))
