"""Dropping the host's copy of constants a backend keeps in its own form.

A compiled partition may say which of its constants it never reads from the host's arrays again
(`CompiledPartition.released_constants`: ONNX Runtime's prepacked weights). `release_constants(loaded)`
drops the program's arrays of those that every partition reading them, in every method, has released, so
their memory is freed while the backend runs from its own copy. It is a choice of the caller (the LLM
loader makes it), because it changes the Program: a released constant becomes a read-only placeholder of
zeros with its shape and dtype (`Program.release_constants`), and the program can no longer be saved or
hashed. A constant that is an output of a method, or read by a partition that did not release it, is kept.
The heap pages freed are then given back to the system (malloc_trim).
"""

from __future__ import annotations

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.heap import return_freed_memory
from edgerun.runtime.loaded_program import LoadedProgram
from edgerun.runtime.methods import RunnableProgram


def releasable_constants(loaded: RunnableProgram) -> set[str]:
    """Constants that every compiled partition of every method reading them has released."""
    released: dict[str, bool] = {}
    for method in _methods(loaded):
        outputs = set(method.graph.outputs)
        for compiled in method.parts.compiled:
            for name in compiled.graph.constants:
                ok = name in compiled.released_constants and name not in outputs
                released[name] = released.get(name, True) and ok
    return {name for name, ok in released.items() if ok}


def release_constants(loaded: RunnableProgram) -> int:
    """Release what `releasable_constants` finds, in the loaded methods and their Program; returns the bytes
    the program's arrays held (freed unless the caller keeps other references to them)."""
    names = releasable_constants(loaded)
    if not names:
        return 0
    for method in _methods(loaded):
        parts = method.parts
        for holder in [parts.graph.constants, parts.views, *(c.graph.constants for c in parts.compiled)]:
            for name in names & holder.keys():
                holder[name] = placeholder(holder[name])
    freed = loaded.program.release_constants(names) if loaded.program is not None else 0
    return_freed_memory()
    return freed


def placeholder(array: np.ndarray) -> np.ndarray:
    """Zeros of `array`'s shape and dtype in one element's memory (read-only)."""
    return np.broadcast_to(np.zeros((), array.dtype), array.shape)


def _methods(loaded: RunnableProgram) -> list[LoadedProgram]:
    methods = [loaded.method(n) for n in loaded.methods]
    templates = [n for n, m in zip(loaded.methods, methods) if not isinstance(m, LoadedProgram)]
    if templates:  # its partitions are a specialisation's, and the next shape's may read any constant
        raise EdgerunError(f"constants are released from programs of fixed shapes; method(s) {templates} are "
                           "templates (symbolic dimensions)")
    return [m for m in methods if isinstance(m, LoadedProgram)]
