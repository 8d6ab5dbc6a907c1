"""Instructions and the profiling hook.

An instruction is a call with no arguments, bound at load time to numpy views of the arena (and to
constants), plus what the tools need to name it. Running a program is calling them in order. Profiling is an
event sink: a callable that receives one InstructionEvent per instruction with its start and end times.
With no sink the executor runs a loop that never looks at one, so profiling costs nothing when off.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Instruction:
    call: Callable[[], None]
    op: str  # the node's op, or "partition" for a delegate call
    node: str  # the node's name, or the partition's label for a delegate call
    backend: str
    partition: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 us per event in the profiled loop
class InstructionEvent:
    """One executed instruction. Its output values are readable (and only until the next instruction
    overwrites arena bytes) through LoadedProgram.value(name) inside the sink."""

    index: int
    instruction: Instruction
    start_ns: int  # time.perf_counter_ns()
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9

    @property
    def op(self) -> str:
        return self.instruction.op

    @property
    def node(self) -> str:
        return self.instruction.node

    @property
    def backend(self) -> str:
        return self.instruction.backend

    @property
    def partition(self) -> int:
        return self.instruction.partition


EventSink = Callable[[InstructionEvent], None]


@dataclass
class EventRecorder:
    """An event sink that keeps every event; the simplest profiler, and what `edgerun plan` uses."""

    events: list[InstructionEvent] = field(default_factory=list)

    def __call__(self, event: InstructionEvent) -> None:
        self.events.append(event)

    def seconds_by(self, key: Callable[[InstructionEvent], object]) -> dict[object, float]:
        totals: dict[object, float] = defaultdict(float)
        for e in self.events:
            totals[key(e)] += e.seconds
        return dict(totals)

    def clear(self) -> None:
        self.events.clear()
