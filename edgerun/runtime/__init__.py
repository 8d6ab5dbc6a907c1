"""The runtime: load a program, place and partition it, plan one arena, run an instruction list.

`load(path_or_program, backends=None, placement=None) -> RunnableProgram` (a LoadedProgram, or a
SpecializingProgram for a template); docs/runtime.md has the design.
"""

from edgerun.runtime.instructions import EventRecorder, EventSink, Instruction, InstructionEvent
from edgerun.runtime.loaded_program import LoadedProgram
from edgerun.runtime.loader import load
from edgerun.runtime.memory_plan import ArenaPlan, TensorLifetime, plan_memory
from edgerun.runtime.methods import RunnableProgram
from edgerun.runtime.partition import Partition, check_acyclic, partition_graph
from edgerun.runtime.plan_verifier import verify_plan

__all__ = [
    "ArenaPlan", "EventRecorder", "EventSink", "Instruction", "InstructionEvent", "LoadedProgram",
    "Partition", "RunnableProgram", "TensorLifetime", "check_acyclic", "load", "partition_graph",
    "plan_memory", "verify_plan"
]
