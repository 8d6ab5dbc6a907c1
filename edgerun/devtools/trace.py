"""Chrome / Perfetto trace JSON (the Trace Event Format) of a profile: one thread per backend.

Open it at ui.perfetto.dev or chrome://tracing. Times are microseconds from the start of the run.
"""

from __future__ import annotations

import json
from typing import Any

from edgerun.devtools.profile import Profile


def chrome_trace(profile: Profile) -> dict[str, Any]:
    backends = sorted({i.backend for i in profile.instructions})
    tid = {b: k + 1 for k, b in enumerate(backends)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"edgerun {profile.program or ''}".strip()}}]
    for b, t in tid.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": b}})
    for i in profile.instructions:
        events.append({"name": i.op, "cat": i.backend, "ph": "X", "pid": 1, "tid": tid[i.backend],
                       "ts": round(i.start_s * 1e6, 3), "dur": round(i.seconds * 1e6, 3),
                       "args": {"node": i.node, "partition": i.partition, "index": i.index}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"median_run_s": profile.median_run_s, "transfers": len(profile.transfers)}}


def write_chrome_trace(profile: Profile, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(chrome_trace(profile), fh)
