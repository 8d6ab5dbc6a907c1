"""StagedRun: a program holding data-dependent ops (nonzero, unique, ...) run as a chain of stages.

ir/staging.py splits the graph at its first data-dependent node. The stage before it is loaded like any
program (a template when it has symbols: specialised and cached per shape); the node runs on its reference
kernel (oracle/data_dependent_kernels.py), which is where its output extent becomes known; the stage after
it is a template whose extent symbol is bound from that output's shape, loaded the same way, and split
again if it holds another such node. Each stage's memory plan is exact for the shapes it sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgerun.ir.staging import split_at_data_dependent
from edgerun.oracle.data_dependent_kernels import DATA_DEPENDENT_KERNELS
from edgerun.program import Program
from edgerun.runtime.instructions import EventSink
from edgerun.runtime.methods import RunnableProgram


class StagedRun:
    """The stages of one template, each loaded by `load_stage` (a static load, or a SpecializingProgram)."""

    def __init__(self, template: Program, load_stage: Callable[[Program], RunnableProgram]) -> None:
        stages = split_at_data_dependent(template.graph)
        self._constants = dict(template.graph.constants)
        self._node = stages.node
        self._prefix = load_stage(Program(stages.prefix, dict(template.metadata))) if stages.prefix.outputs \
            else None
        self._prefix_outputs = list(stages.prefix.outputs)
        self._suffix_inputs = list(stages.suffix.inputs)
        self._suffix = load_stage(Program(stages.suffix, dict(template.metadata)))

    def run(self, inputs: Mapping[str, Any], sink: EventSink | None = None) -> list[np.ndarray]:
        env: dict[str, Any] = dict(inputs)
        if self._prefix is not None:
            env.update(zip(self._prefix_outputs, self._prefix.run(dict(inputs), sink)))
        node = self._node
        args = [np.asarray(env[i] if i in env else self._constants[i]) for i in node.inputs if i]
        env.update(zip(node.outputs, DATA_DEPENDENT_KERNELS[node.op](args, node.attrs)))
        return self._suffix.run({n: env[n] for n in self._suffix_inputs}, sink)
