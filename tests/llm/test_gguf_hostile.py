"""Hostile GGUF files: a header declaring more than the file holds is a clear error, not a memory bomb.

The files are read in a child process under an address-space limit, so a reader that loops over a declared
length (up to 2**64) fails the test with MemoryError instead of taking the machine's memory."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_READ = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from edgerun.errors import EdgerunError
from edgerun.llm.gguf_reader import read_gguf
for path in sys.argv[1:]:
    try:
        read_gguf(path)
    except EdgerunError as exc:
        print(exc, flush=True)
"""


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _header(kv: bytes, kv_count: int = 1, tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + kv


ARRAY, UINT8, STRING = 9, 0, 8
HOSTILE = {
    # an array of 2**62 bytes in a 40-byte file (gguf appended an empty read per declared element)
    "array-longer-than-file": _header(_string("a") + struct.pack("<IIQ", ARRAY, UINT8, 1 << 62) + b"\1\2"),
    # an array of 2**40 empty arrays of strings: every element a header the file does not hold
    "nested-arrays-past-end": _header(_string("a") + struct.pack("<IIQ", ARRAY, ARRAY, 1 << 40)
                                      + struct.pack("<IQ", STRING, 0)),
    # 2**60 key-value pairs declared, one present
    "kv-count-past-end": _header(_string("a") + struct.pack("<IB", UINT8, 7), kv_count=1 << 60),
    # a string that declares 2**63 bytes
    "key-longer-than-file": _header(struct.pack("<Q", 1 << 63) + b"xyz"),
    "string-longer-than-file": _header(_string("a") + struct.pack("<IQ", STRING, 1 << 63) + b"xyz"),
    # 2**50 tensors declared, none described
    "tensor-count-past-end": _header(b"", kv_count=0, tensor_count=1 << 50),
}


def test_a_header_declaring_more_than_the_file_holds_is_a_clear_error(tmp_path: Path) -> None:
    paths = []
    for name, data in sorted(HOSTILE.items()):
        paths.append(tmp_path / f"{name}.gguf")
        paths[-1].write_bytes(data)
    r = subprocess.run([sys.executable, "-c", _READ, *map(str, paths)], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and not r.stderr, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths), r.stdout
    for path, line in zip(paths, lines, strict=True):
        assert path.name in line and "damaged or truncated GGUF file" in line, line
        assert "past the end of the file" in line and "MemoryError" not in line, line
