"""The single-file program format: a versioned header, the graph as canonical JSON, aligned weight segments.

Loading needs numpy and the standard library only. The spec is docs/program-format.md.
"""

from __future__ import annotations

from edgerun.program.format import FORMAT_MAJOR, FORMAT_MINOR
from edgerun.program.program import Program, ProgramFileInfo
from edgerun.program.summary import ProgramSummary

__all__ = ["FORMAT_MAJOR", "FORMAT_MINOR", "Program", "ProgramFileInfo", "ProgramSummary"]
