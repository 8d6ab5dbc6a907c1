"""A placer: what chooses the placement of each concrete graph when the caller does not.

`load(source, placer=...)` handles methods, state and templates itself, once, and asks the placer about
each concrete graph it reaches (each method; each shape's or value's specialisation): `candidates()` are the
backends the graph is prepared for (the composites none of them keeps are lowered first), and `place` returns
the placement, the algorithm choices and the backend instances to build with. A placer may load candidates
to measure them, through the `load` it is handed (the runtime puts a program's state back after), and hand
back the one it chose already loaded. The load-time search (`edgerun.search`, `backends="auto"`) is the
placer the project ships; the runtime never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from edgerun.backends.base import Backend
from edgerun.ir.graph import Graph

if TYPE_CHECKING:
    from edgerun.program import Program
    from edgerun.runtime.loaded_program import LoadedProgram

# (placement, algorithms, backends) -> the prepared graph loaded so, on the program's state
CandidateLoad = Callable[[Mapping[str, str], Mapping[str, str], Sequence[Backend]], "LoadedProgram"]


@dataclass
class Placed:
    placement: dict[str, str]  # node name -> backend name, every node of the prepared graph
    algorithms: dict[str, str] = field(default_factory=dict)  # node name -> algorithm, where a backend offers some
    backends: list[Backend] = field(default_factory=list)  # the instances to build with, in preference order
    loaded: LoadedProgram | None = None  # that placement already loaded (a measured winner): no second build
    record: object = None  # what chose it, kept as LoadedProgram.search (`edgerun plan` shows it)


class Placer(Protocol):
    def candidates(self) -> list[Backend]: ...

    def place(self, program: Program | None, graph: Graph, load: CandidateLoad) -> Placed: ...
