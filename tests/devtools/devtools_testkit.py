"""Shared by the devtools tests: the proof model saved as a program, its realistic inputs as .npz files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgerun.devtools.fault_proof import proof_model, realistic_inputs
from edgerun.devtools.programs import save_inputs
from edgerun.program import Program


def write_proof_program(tmp: Path) -> tuple[str, list[str]]:
    """(program path, input .npz paths) in `tmp`."""
    program = tmp / "proof.erp"
    Program(graph=proof_model()).save(program)
    paths = []
    for k, inputs in enumerate(realistic_inputs()):
        path = tmp / f"real{k}.npz"
        save_inputs(path, inputs)
        paths.append(str(path))
    return str(program), paths


def npy_is_plain(path: Path) -> bool:
    """True when an .npy file holds a plain (non-object) dtype, so it loads with allow_pickle=False."""
    arr = np.load(path, allow_pickle=False)
    return arr.dtype != object
