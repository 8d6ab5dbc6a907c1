"""JSON from untrusted peers, parsed only after its nesting is known to be bounded.

Python's `json` parser recurses once per `[` or `{`: a 100,000-deep document raises RecursionError (a 500
where a 400 belongs) after using the C stack. `nesting_depth` measures the depth without parsing, at
C speed (strings are blanked by one regular expression, then numpy takes a running sum of the brackets),
so a server refuses such a document before `json.loads` sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_DEPTH = 64
# A JSON string: quotes around anything but quotes and backslashes, or escapes (unrolled: no backtracking).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


class TooDeepError(ValueError):
    """A JSON document nested deeper than allowed; refused before parsing."""


def nesting_depth(data: bytes | str) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings not counted."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    chars = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (chars == ord("[")).view(np.int8) + (chars == ord("{")).view(np.int8) \
        - (chars == ord("]")).view(np.int8) - (chars == ord("}")).view(np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def loads_bounded(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads(data)`, after refusing nesting deeper than `max_depth` with TooDeepError."""
    depth = nesting_depth(data)
    if depth > max_depth:
        raise TooDeepError(f"nested {depth} levels deep; at most {max_depth} allowed")
    return json.loads(data)
