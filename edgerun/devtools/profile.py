"""Per-instruction timings through the runtime's profiling hook, with the backend and partition of each.

The program is loaded once (with the requested backends and placement) and run `warmup + repeat` times with
an EventRecorder; each instruction's time is the median over the timed runs. Transfers are the values that
cross between partitions on different backends: their bytes, and the seconds each backend's own
transfer_cost gives for them (zero for host-memory backends).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgerun.backends.base import Backend
from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.runtime.instructions import EventRecorder
from edgerun.runtime.loader import load


@dataclass(frozen=True)
class InstructionTime:
    index: int
    node: str
    op: str
    backend: str
    partition: int
    seconds: float  # median over the timed runs
    start_s: float  # offset from the run's start, in the median-length run (for the timeline)


@dataclass(frozen=True)
class Transfer:
    value: str
    nbytes: int
    src_backend: str
    dst_backend: str
    seconds: float


@dataclass
class Profile:
    program: str | None
    backends: list[str]
    instructions: list[InstructionTime] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    run_seconds: list[float] = field(default_factory=list)  # wall time of each timed run

    @property
    def median_run_s(self) -> float:
        return statistics.median(self.run_seconds) if self.run_seconds else 0.0

    def by(self, key: str) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for i in self.instructions:
            totals[str(getattr(i, key))] += i.seconds
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def counts_by(self, key: str) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for i in self.instructions:
            counts[str(getattr(i, key))] += 1
        return dict(counts)

    def table(self, top: int = 15) -> str:
        total = sum(i.seconds for i in self.instructions) or 1e-12
        lines = [f"profile: {len(self.instructions)} instructions on {', '.join(self.backends)}; median run "
                 f"{self.median_run_s * 1e3:.3f} ms over {len(self.run_seconds)} runs", "",
                 f"top {top} instructions", f"{'#':>4} {'node':<28} {'op':<14} {'backend':<12} {'part':>4} "
                 f"{'ms':>9} {'%':>6}"]
        for i in sorted(self.instructions, key=lambda i: -i.seconds)[:top]:
            lines.append(f"{i.index:>4} {i.node[:28]:<28} {i.op:<14} {i.backend[:12]:<12} {i.partition:>4} "
                         f"{i.seconds * 1e3:>9.4f} {100 * i.seconds / total:>6.1f}")
        for key, title in (("op", "time by op type"), ("backend", "time by backend")):
            counts = self.counts_by(key)
            lines += ["", title, f"{key:<16} {'count':>6} {'ms':>10} {'%':>6}"]
            for name, s in self.by(key).items():
                lines.append(f"{name:<16} {counts[name]:>6} {s * 1e3:>10.4f} {100 * s / total:>6.1f}")
        nbytes = sum(t.nbytes for t in self.transfers)
        lines += ["", f"transfers between backends: {len(self.transfers)} values, {nbytes} B, "
                  f"{sum(t.seconds for t in self.transfers) * 1e3:.4f} ms estimated"]
        for t in self.transfers[:top]:
            lines.append(f"  {t.value:<28} {t.nbytes:>10} B  {t.src_backend} -> {t.dst_backend}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"program": self.program, "backends": self.backends, "run_seconds": self.run_seconds,
                "instructions": [i.__dict__ for i in self.instructions],
                "transfers": [t.__dict__ for t in self.transfers], "by_op": self.by("op"),
                "by_backend": self.by("backend")}


def profile_program(loaded: LoadedGraph, backends: Sequence[Backend], inputs: InputSet, *,
                    placement: Mapping[str, str] | None = None, repeat: int = 5, warmup: int = 1) -> Profile:
    program = load(loaded.graph, list(backends), placement=placement)
    runs: list[EventRecorder] = []
    for k in range(warmup + max(1, repeat)):
        rec = EventRecorder()
        program.run(inputs, sink=rec)
        if k >= warmup:
            runs.append(rec)
    walls = [(r.events[-1].end_ns - r.events[0].start_ns) * 1e-9 if r.events else 0.0 for r in runs]
    timeline = runs[sorted(range(len(runs)), key=lambda k: walls[k])[len(runs) // 2]]
    t0 = timeline.events[0].start_ns if timeline.events else 0
    profile = Profile(loaded.path, sorted({p.backend for p in program.partitions}), run_seconds=walls)
    for k, event in enumerate(timeline.events):
        median = statistics.median(r.events[k].seconds for r in runs)
        profile.instructions.append(InstructionTime(event.index, event.node, event.op, event.backend,
                                                    event.partition, median, (event.start_ns - t0) * 1e-9))
    by_name = {b.name: b for b in backends}
    part_backend = {p.index: p.backend for p in program.partitions}
    owner = {o: p.index for p in program.partitions for o in p.outputs}
    for p in program.partitions:
        for value in p.inputs:
            src = owner.get(value)
            if src is None or part_backend[src] == p.backend:
                continue
            nbytes = loaded.graph.specs[value].nbytes
            cost = sum(by_name[b].transfer_cost(nbytes) for b in (part_backend[src], p.backend) if b in by_name)
            profile.transfers.append(Transfer(value, nbytes, part_backend[src], p.backend, cost))
    return profile
