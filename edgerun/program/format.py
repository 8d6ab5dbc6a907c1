"""The fixed parts of the program file: magic, version, header layout, alignment and the reader's limits.

Everything a reader trusts before it has verified a checksum is bounded by a constant in this module, so a
hostile file can make the reader fail but never make it allocate or loop in proportion to a number it wrote.
`docs/program-format.md` is the prose spec of the same facts; keep the two in step.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from edgerun.errors import ProgramFormatError

MAGIC = b"EDGR"
# Major: bumped when an old reader would misread a new file. Minor: bumped for additions old readers may
# safely ignore (new optional JSON keys, a longer header). A reader accepts every minor of its own major.
FORMAT_MAJOR = 1
# Minor 1: graphs keep some composite ops (softmax, layer_norm, gelu, ...) for the device to lower at load;
# a 1.0 reader already decomposed every composite at load, so it reads 1.1 files correctly.
# Minor 2: template programs: the graph may declare bounded symbols (`"symbols"`) and use symbolic
# dimensions (`{"sym": "..."}`) in value specs and attributes; programs with several methods, a default
# method or state (program_parts.py); and graphs with bodies of control-flow nodes (`"subgraphs"`, their
# weights under qualified names). Only such programs are written as 1.2; any other program is still
# written as 1.1, byte for byte, so older readers keep loading it. A 1.1 reader refuses a 1.2 file that
# has methods or state (their segments are not its graph's), or control-flow ops (not in its registry).
FORMAT_MINOR = 2
STATIC_FORMAT_MINOR = 1

# 64 bytes is a cache line on x86 and most ARM cores and the width of an AVX-512 register, so a kernel can
# use aligned vector loads on any weight straight out of the mapped file. Page alignment (4 KiB) would only
# matter for mapping segments one by one; we map the whole file (the map itself starts on a page), and page
# padding would waste up to 4 KiB on each of the hundreds of small constants (biases, scales) a model has.
ALIGNMENT = 64

# -- header ------------------------------------------------------------------------------------------------
# Little-endian. The checksum is SHA-256 over the header (with the checksum field zeroed) followed by the
# graph section, so one digest authenticates every byte a reader interprets before touching the weights.
_HEADER_STRUCT = struct.Struct("<4sHHII QQQQQ 32s 40s")
HEADER_SIZE = _HEADER_STRUCT.size  # 128
CHECKSUM_OFFSET = 56
CHECKSUM_SIZE = 32
# A later minor version may grow the header; this caps what a reader will skip over.
MAX_HEADER_SIZE = 4096

# -- limits (all enforced by the reader, and by the writer so that what we write we can read) --------------
MAX_GRAPH_SECTION_BYTES = 64 * 1024 * 1024
MAX_JSON_CONTAINERS = 4_000_000  # '{' plus '[' bytes in the graph section, counted before parsing
MAX_JSON_DEPTH = 32  # nesting of attribute and metadata values
MAX_DOCUMENT_DEPTH = MAX_JSON_DEPTH + 8  # bracket nesting of the whole graph section, checked before parsing
MAX_NODES = 250_000
MAX_VALUES = 1_000_000  # tensor specs, graph inputs, graph outputs, segments: each list is capped by this
MAX_NODE_INPUTS = 4096
MAX_NODE_OUTPUTS = 1024
MAX_ATTRS_PER_NODE = 256
MAX_META_PER_NODE = 64
MAX_METADATA_ENTRIES = 1024
MAX_NAME_LENGTH = 4096  # characters, for value names, node names, op names and dict keys
MAX_STRING_LENGTH = 1 << 20  # characters, for string attribute, meta and metadata values
MAX_RANK = 8
MAX_DIM = 1 << 40
MAX_ELEMENTS = 1 << 48  # product of a shape's dimensions


@dataclass(frozen=True)
class Header:
    """The fixed-size header at offset 0. Offsets are from the start of the file."""

    major: int
    minor: int
    flags: int
    header_size: int
    file_length: int
    graph_offset: int
    graph_length: int
    data_offset: int
    data_length: int
    checksum: bytes = bytes(CHECKSUM_SIZE)
    reserved: bytes = bytes(40)

    def pack(self) -> bytes:
        return _HEADER_STRUCT.pack(MAGIC, self.major, self.minor, self.flags, self.header_size,
                                   self.file_length, self.graph_offset, self.graph_length,
                                   self.data_offset, self.data_length, self.checksum, self.reserved)

    @staticmethod
    def unpack(raw: bytes) -> Header:
        """Decode the first HEADER_SIZE bytes; checks only the magic (the reader validates the rest)."""
        if len(raw) < HEADER_SIZE:
            raise ProgramFormatError(f"truncated program: {len(raw)} bytes, the header alone is {HEADER_SIZE}")
        fields = _HEADER_STRUCT.unpack(raw[:HEADER_SIZE])
        if fields[0] != MAGIC:
            raise ProgramFormatError(f"not an edgerun program: magic is {fields[0]!r}, expected {MAGIC!r}")
        return Header(*fields[1:])


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment
