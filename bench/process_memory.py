"""A benchmark worker's own peak resident memory.

VmHWM (the high-water mark in /proc/self/status) starts afresh at exec. getrusage's ru_maxrss does not: Linux
carries the parent's peak into a process it starts, so a worker would report at least what its driver held
(bench/llm.py's driver holds Gemma 3's 262,144-token tokenizer: 687 MB, above llama.cpp's own 359).
"""

from __future__ import annotations

import resource


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: VmHWM, or ru_maxrss where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
