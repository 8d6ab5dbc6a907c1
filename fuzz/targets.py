"""The fuzz targets: one function per parser of untrusted bytes, and the errors each may raise.

Each target takes the fuzzer's bytes and calls the parser the way a device or server does. The parser's
documented refusal (an EdgerunError subclass, the stream end's HTTP 400/413) is the expected answer to bad
bytes; anything else escaping it (IndexError, RecursionError, MemoryError, a hang) is a finding. Files on
disk (GGUF, task packages) are written to a RAM-backed scratch folder first, since those readers take
paths.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

TargetFn = Callable[[bytes], None]
_SCRATCH = Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())


@contextlib.contextmanager
def _scratch_file(data: bytes, suffix: str) -> Iterator[Path]:
    """`data` in a file for the length of one execution (removed after it: libFuzzer ends the process
    without running atexit handlers)."""
    path = _SCRATCH / f"edgerun-fuzz-{os.getpid()}{suffix}"
    path.write_bytes(data)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def program_file(data: bytes) -> None:
    """The program file reader (`edgerun.load`, `edgerun info`). The header checksum is fixed up after the
    mutation, so the fuzzer reaches the graph section and the segment table instead of stopping there."""
    from edgerun.errors import EdgerunError
    from edgerun.program.format import CHECKSUM_OFFSET, CHECKSUM_SIZE, HEADER_SIZE, Header
    from edgerun.program.reader import decode_program, header_checksum

    buffer = bytearray(data)
    with contextlib.suppress(EdgerunError):
        if len(buffer) >= HEADER_SIZE:
            header = Header.unpack(bytes(buffer[:HEADER_SIZE]))
            if header.graph_offset + header.graph_length <= len(buffer):
                buffer[CHECKSUM_OFFSET:CHECKSUM_OFFSET + CHECKSUM_SIZE] = header_checksum(bytes(buffer), header)
        decode_program(bytes(buffer))


def gguf(data: bytes) -> None:
    """The GGUF reader (`edgerun llm`, `web export`)."""
    from edgerun.errors import EdgerunError
    from edgerun.llm.gguf_reader import read_gguf

    with _scratch_file(data, ".gguf") as path, contextlib.suppress(EdgerunError):
        read_gguf(path)


def onnx_model(data: bytes) -> None:
    """The ONNX loader and importer (`edgerun import-onnx`, `from_onnx`) on model bytes."""
    from edgerun.errors import EdgerunError
    from edgerun.frontends.onnx import from_onnx

    with contextlib.suppress(EdgerunError):
        from_onnx(data)


def task_package(data: bytes) -> None:
    """The task package reader (`task publish`, the server on publish)."""
    from edgerun.fleet.errors import FleetError
    from edgerun.fleet.package import read_package

    with _scratch_file(data, ".tar") as path, contextlib.suppress(FleetError):
        read_package(path)


def remote_wire(data: bytes) -> None:
    """The remote runtime's wire decoder: a header frame and tensor frames (the input is split at NUL
    bytes after the first, a cheap framing the mutator can change)."""
    from edgerun.remote.wire import Limits, WireError, decode_header, decode_tensors

    head, *frames = data.split(b"\0\0")
    with contextlib.suppress(WireError):
        decode_tensors(decode_header(head), frames, Limits(max_tensor_bytes=1 << 20, max_message_bytes=1 << 22))


def stream_batch(data: bytes) -> None:
    """The stream end's batch decoder: zstd (first byte odd) or plain JSON, then the records' rows."""
    from fastapi import HTTPException

    from edgerun.stream.cloud import _rows, decode_batch

    try:
        batch = decode_batch(data[1:], "zstd" if data[:1] and data[0] & 1 else None)
        _rows(batch["device_id"], batch["records"], 0)
    except HTTPException as exc:
        if exc.status_code not in (400, 413):
            raise


TARGETS: dict[str, TargetFn] = {
    "program_file": program_file, "gguf": gguf, "onnx_model": onnx_model, "task_package": task_package,
    "remote_wire": remote_wire, "stream_batch": stream_batch,
}
CORPUS = Path(__file__).with_name("corpus")
REGRESSIONS = Path(__file__).with_name("regressions")
