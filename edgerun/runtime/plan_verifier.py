"""verify_plan: prove an arena plan safe, independently of the algorithm that made it.

Safe means: every buffer is aligned and inside the arena, every value fits its buffer for its whole
lifetime, and no two values that are live at the same step share a byte unless they are declared aliases of
one buffer (a no-op reshape reading the very bytes it would have copied). The check is on values rather than
buffers, so a wrong union of alias lifetimes is caught too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgerun.errors import VerificationError
from edgerun.runtime.memory_plan import ALIGNMENT, ArenaPlan, TensorLifetime


def verify_plan(plan: ArenaPlan, lifetimes: Mapping[str, TensorLifetime] | None = None) -> None:
    """Raise VerificationError on the first unsafe placement.

    `lifetimes`, when given, are the value lifetimes recomputed from the schedule; the plan must cover each
    (a plan made from stale lifetimes would otherwise pass its own bookkeeping).
    """
    for name, buf in plan.buffers.items():
        off = plan.offsets.get(name)
        if off is None:
            raise VerificationError(f"buffer {name!r} has no offset")
        if off < 0 or off % ALIGNMENT:
            raise VerificationError(f"buffer {name!r} at offset {off} is not {ALIGNMENT}-byte aligned")
        if off + buf.nbytes > plan.arena_bytes:
            raise VerificationError(f"buffer {name!r} [{off}, {off + buf.nbytes}) leaves the "
                                    f"{plan.arena_bytes}-byte arena")
    for name, v in plan.values.items():
        root = plan.buffer_of(name)
        if root not in plan.buffers:
            raise VerificationError(f"value {name!r} aliases {root!r}, which is not a buffer")
        buf = plan.buffers[root]
        if v.nbytes > buf.nbytes or v.first < buf.first or v.last > buf.last:
            raise VerificationError(f"value {name!r} ({v.nbytes} B, steps {v.first}..{v.last}) does not fit "
                                    f"its buffer {root!r} ({buf.nbytes} B, steps {buf.first}..{buf.last})")
    if lifetimes is not None:
        for name, want in lifetimes.items():
            got = plan.values.get(name)
            if got is None:
                raise VerificationError(f"value {name!r} is not planned")
            if got.nbytes < want.nbytes or got.first > want.first or got.last < want.last:
                raise VerificationError(f"value {name!r} is planned for steps {got.first}..{got.last} "
                                        f"({got.nbytes} B) but lives {want.first}..{want.last} ({want.nbytes} B)")
    _check_no_shared_bytes(plan)


def _check_no_shared_bytes(plan: ArenaPlan) -> None:
    names = [n for n, v in plan.values.items() if v.nbytes > 0]
    if not names:
        return
    first = np.array([plan.values[n].first for n in names], np.int64)
    last = np.array([plan.values[n].last for n in names], np.int64)
    lo = np.array([plan.offset_of(n) for n in names], np.int64)
    hi = lo + np.array([plan.values[n].nbytes for n in names], np.int64)
    roots = [plan.buffer_of(n) for n in names]
    root_ids = np.array([hash(r) for r in roots], np.int64)
    for i in range(len(names) - 1):
        rest = slice(i + 1, None)
        clash = ((first[rest] <= last[i]) & (last[rest] >= first[i])
                 & (lo[rest] < hi[i]) & (hi[rest] > lo[i]))
        if clash.any():
            for j in np.flatnonzero(clash) + i + 1:
                if root_ids[j] == root_ids[i] and roots[j] == roots[i]:
                    continue  # declared aliases of one buffer
                a, b = plan.values[names[i]], plan.values[names[j]]
                raise VerificationError(
                    f"values {names[i]!r} (steps {a.first}..{a.last}, bytes {lo[i]}..{hi[i]}) and "
                    f"{names[j]!r} (steps {b.first}..{b.last}, bytes {lo[j]}..{hi[j]}) are live together "
                    "and share bytes")
