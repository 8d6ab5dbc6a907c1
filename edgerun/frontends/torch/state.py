"""Torch buffers that `forward` mutates become program state (ir/state.py).

torch.export functionalises a buffer mutation (`self.count += 1`, `self.cache[:, pos] = k`, `copy_`): the
buffer is a graph input (`inputs_to_buffers`) and its new value an extra graph output (`buffers_to_mutate`).
The converter turns the first into a state read and the second into the state's update; the buffer's value
at export time is the state's initial value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StateCapture:
    """Which buffers (by their FQN in the exported module) are state, under which state names; the
    converter fills `initial` (state name -> value at export time, in the program's dtype)."""

    names: dict[str, str]  # buffer FQN -> state name
    initial: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, ep: Any, prefix: str = "") -> StateCapture:
        """The buffers `ep` mutates, named by their FQN less `prefix`."""
        return cls({target: target.removeprefix(prefix) for target in mutated_buffers(ep)})


def mutated_buffers(ep: Any) -> list[str]:
    """FQNs of the buffers an ExportedProgram writes, in the signature's order."""
    return list(dict.fromkeys(ep.graph_signature.buffers_to_mutate.values()))


def buffer_data(ep: Any, target: str) -> Any:
    return ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
