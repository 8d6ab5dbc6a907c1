"""Truncated and corrupted files, and files from other versions, fail with a clear ProgramFormatError."""

from __future__ import annotations

import hashlib

import pytest
from program_testkit import (
    HEADER_FIELDS,
    build_sample_graph,
    get_header_field,
    reseal,
    set_header_field,
    split_program,
)

from edgerun.errors import ProgramFormatError
from edgerun.program import FORMAT_MAJOR, FORMAT_MINOR, Program
from edgerun.program.format import CHECKSUM_OFFSET, HEADER_SIZE, MAX_GRAPH_SECTION_BYTES, Header, align_up


@pytest.fixture(scope="module")
def raw() -> bytes:
    return Program(build_sample_graph()).to_bytes()


def _boundaries(raw: bytes) -> list[int]:
    header, document, _ = split_program(raw)
    points = {0, 1, 3, 4, 8, 16, 56, 88, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1,
              header.graph_offset + header.graph_length // 2, header.graph_offset + header.graph_length - 1,
              header.graph_offset + header.graph_length, header.data_offset - 1, header.data_offset,
              len(raw) - 1}
    for seg in document["segments"]:
        start = header.data_offset + seg["offset"]
        points |= {start, start + 1, start + seg["nbytes"] // 2, start + seg["nbytes"] - 1}
    return sorted(p for p in points if 0 <= p < len(raw))


def test_truncation_at_every_boundary_is_reported_as_truncation(raw: bytes, tmp_path) -> None:
    cuts = _boundaries(raw)
    assert len(cuts) > 30
    for cut in cuts:
        with pytest.raises(ProgramFormatError, match="truncated"):
            Program.from_bytes(raw[:cut])
        path = tmp_path / f"cut{cut}.edgr"
        path.write_bytes(raw[:cut])
        with pytest.raises(ProgramFormatError, match="truncated"):
            Program.read(path)


def test_trailing_bytes_are_rejected(raw: bytes) -> None:
    with pytest.raises(ProgramFormatError, match="after its end"):
        Program.from_bytes(raw + b"\0")


def test_every_single_bit_flip_is_detected(raw: bytes) -> None:
    """One flip per byte, cycling through bit positions: every byte of the file is covered by some check."""
    messages = set()
    for i in range(len(raw)):
        damaged = bytearray(raw)
        damaged[i] ^= 1 << (i % 8)
        with pytest.raises(ProgramFormatError) as info:
            Program.from_bytes(bytes(damaged))
        messages.add(str(info.value).split(":")[0])
    assert any("checksum mismatch in the header" in m for m in messages)
    assert any("checksum mismatch in weight segment" in m for m in messages)


def test_flips_in_padding_are_detected(raw: bytes) -> None:
    header, document, _ = split_program(raw)
    graph_end = header.graph_offset + header.graph_length
    assert header.data_offset > graph_end
    damaged = bytearray(raw)
    damaged[graph_end] = 1
    with pytest.raises(ProgramFormatError, match="padding"):
        Program.from_bytes(bytes(damaged))
    ends = sorted(s["offset"] + s["nbytes"] for s in document["segments"])
    gap = next(e for e in ends if e % 64)  # a segment whose end is followed by alignment padding
    damaged = bytearray(raw)
    damaged[header.data_offset + gap] = 1
    with pytest.raises(ProgramFormatError, match="padding bytes in the data region"):
        Program.from_bytes(bytes(damaged))


# Each header field, set to a wrong value (checksum left stale), must be named or caught by the checksum.
@pytest.mark.parametrize("field, value, message", [
    ("magic", b"EDGX", "not an edgerun program"),
    ("magic", b"\x89PNG", "not an edgerun program"),
    ("major", FORMAT_MAJOR + 1, "newer than this reader"),
    ("major", 0, "older than this reader"),
    ("minor", FORMAT_MINOR + 1, "checksum"),
    ("flags", 1, "flags"),
    ("flags", 0x80000000, "flags"),
    ("header_size", 64, "header size"),
    ("header_size", HEADER_SIZE + 8, "header size"),
    ("header_size", 2**32 - 1, "header size"),
    ("file_length", 0, "after its end"),
    ("file_length", 2**64 - 1, "truncated"),
    ("graph_offset", 0, "graph section offset"),
    ("graph_offset", 2**63, "graph section offset"),
    ("graph_length", MAX_GRAPH_SECTION_BYTES + 1, "exceeds the limit"),
    ("graph_length", 2**64 - 1, "exceeds the limit"),
    ("graph_length", 5, "data region offset"),
    ("data_offset", 0, "data region offset"),
    ("data_offset", 2**64 - 64, "data region offset"),
    ("data_length", 0, "does not end at the end of the file"),
    ("data_length", 2**64 - 1, "does not end at the end of the file"),
    ("checksum", b"\0" * 32, "checksum mismatch"),
    ("reserved", b"\1" + b"\0" * 39, "reserved"),
])
def test_corrupted_header_field_gives_a_clear_error(raw: bytes, field: str, value, message: str) -> None:
    with pytest.raises(ProgramFormatError, match=message):
        Program.from_bytes(set_header_field(raw, field, value))


def test_every_header_field_is_covered(raw: bytes) -> None:
    """Adding one to any numeric header field (or flipping a byte of the others) is caught."""
    for field, (offset, code) in HEADER_FIELDS.items():
        if code.endswith("s"):
            damaged = bytearray(raw)
            damaged[offset] ^= 0xFF
            damaged_raw = bytes(damaged)
        else:
            damaged_raw = set_header_field(raw, field, get_header_field(raw, field) + 1)
        with pytest.raises(ProgramFormatError):
            Program.from_bytes(damaged_raw)


def test_newer_major_version_names_both_versions(raw: bytes) -> None:
    _, document, data = split_program(raw)
    newer = reseal(document, data, major=FORMAT_MAJOR + 1, minor=3)
    with pytest.raises(ProgramFormatError) as info:
        Program.from_bytes(newer)
    assert f"{FORMAT_MAJOR + 1}.3" in str(info.value)
    assert f"{FORMAT_MAJOR}.{FORMAT_MINOR}" in str(info.value)


def test_newer_minor_version_loads_and_ignores_keys_it_does_not_know(raw: bytes) -> None:
    _, document, data = split_program(raw)
    document["future_section"] = {"anything": [1, 2]}
    document["graph"]["nodes"][0]["future_field"] = "x"
    document["segments"][0]["compression"] = "none"
    document["graph"]["values"]["x"]["layout"] = "nchw"
    with pytest.raises(ProgramFormatError, match="unknown key"):
        Program.from_bytes(reseal(document, data))  # same minor: an unknown key is corruption
    loaded = Program.from_bytes(reseal(document, data, minor=FORMAT_MINOR + 1))
    assert loaded.file_info is not None and loaded.file_info.format_version == (FORMAT_MAJOR, FORMAT_MINOR + 1)
    assert loaded.program_hash() == Program.from_bytes(raw).program_hash()


def test_same_and_older_minor_versions_load(raw: bytes) -> None:
    _, document, data = split_program(raw)
    for minor in range(FORMAT_MINOR + 1):
        loaded = Program.from_bytes(reseal(document, data, minor=minor))
        assert loaded.file_info is not None and loaded.file_info.format_version == (FORMAT_MAJOR, minor)


def test_unknown_flags_are_refused_even_with_a_valid_checksum(raw: bytes) -> None:
    _, document, data = split_program(raw)
    with pytest.raises(ProgramFormatError, match="flags 0x00000004"):
        Program.from_bytes(reseal(document, data, flags=4))


def test_empty_and_tiny_files(tmp_path) -> None:
    for content in (b"", b"E", b"EDGR", b"EDGR" + bytes(200)):
        path = tmp_path / "tiny.edgr"
        path.write_bytes(content)
        with pytest.raises(ProgramFormatError):
            Program.read(path)
        with pytest.raises(ProgramFormatError):
            Program.from_bytes(content)


def test_newer_minor_version_with_a_longer_header_loads(raw: bytes) -> None:
    header, _, data = split_program(raw)
    section = raw[header.graph_offset:header.graph_offset + header.graph_length]
    extra = b"future header field"
    header_size = HEADER_SIZE + 64
    data_offset = align_up(header_size + len(section))
    longer = Header(FORMAT_MAJOR, FORMAT_MINOR + 1, 0, header_size, data_offset + len(data), header_size,
                    len(section), data_offset, len(data), reserved=b"\x07" * 40)
    prefix = longer.pack() + extra.ljust(64, b"\0") + section
    digest = hashlib.sha256(prefix).digest()  # the checksum field is still zero here
    prefix = prefix[:CHECKSUM_OFFSET] + digest + prefix[CHECKSUM_OFFSET + 32:]
    grown = prefix + bytes(data_offset - len(prefix)) + data
    loaded = Program.from_bytes(grown)
    assert loaded.program_hash() == Program.from_bytes(raw).program_hash()
    same_minor = set_header_field(grown, "minor", FORMAT_MINOR)
    with pytest.raises(ProgramFormatError, match="header size"):
        Program.from_bytes(same_minor)
