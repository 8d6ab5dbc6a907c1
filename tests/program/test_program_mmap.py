"""Zero-copy loading: with mmap=True weights are read-only views of one map of the file."""

from __future__ import annotations

import mmap
import os
import time

import numpy as np
import pytest
from program_testkit import build_sample_graph, split_program

from edgerun.errors import ProgramFormatError
from edgerun.program import Program


def _root_buffer(array: np.ndarray) -> object:
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.edgr"
    Program(build_sample_graph()).save(path)
    return path


def test_weights_are_views_of_the_file_map_not_copies(saved) -> None:
    program = Program.read(saved, mmap=True)
    header, document, _ = split_program(saved.read_bytes())
    roots = {id(_root_buffer(a)) for a in program.graph.constants.values()}
    assert len(roots) == 1  # every weight hangs off the same map
    the_map = _root_buffer(program.graph.constants["w_f32"])
    assert isinstance(the_map, mmap.mmap)
    assert len(the_map) == saved.stat().st_size
    # Each array's memory is the map's memory at data_offset + the segment's offset.
    map_start = np.frombuffer(the_map, np.uint8).ctypes.data
    for seg in document["segments"]:
        array = program.graph.constants[seg["name"]]
        if array.size:
            assert array.ctypes.data == map_start + header.data_offset + seg["offset"], seg["name"]


def test_mapped_weights_are_read_only(saved) -> None:
    array = Program.read(saved).graph.constants["w_f32"]
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1.0
    with pytest.raises(ValueError):
        array.flags.writeable = True  # numpy refuses: the underlying map is read-only


def test_from_bytes_weights_are_read_only_views_of_the_bytes() -> None:
    raw = Program(build_sample_graph()).to_bytes()
    array = Program.from_bytes(raw).graph.constants["w_i64"]
    assert _root_buffer(array) is raw
    assert not array.flags.writeable


def test_read_without_mmap_owns_its_bytes(saved) -> None:
    array = Program.read(saved, mmap=False).graph.constants["w_f32"]
    assert isinstance(_root_buffer(array), bytes)
    assert not array.flags.writeable


def test_fast_load_skips_weight_hashing_but_still_checks_the_graph(saved) -> None:
    raw = bytearray(saved.read_bytes())
    header, document, _ = split_program(bytes(raw))
    seg = next(s for s in document["segments"] if s["name"] == "w_f32")
    raw[header.data_offset + seg["offset"]] ^= 0xFF  # corrupt a weight byte
    saved.write_bytes(bytes(raw))
    fast = Program.read(saved, verify_weights=False)
    assert fast.file_info is not None and not fast.file_info.weights_verified
    assert fast.graph.constants["w_f32"].tobytes() != Program(build_sample_graph()).graph.constants["w_f32"].tobytes()
    with pytest.raises(ProgramFormatError, match="w_f32"):
        Program.read(saved)  # the default verifies everything
    raw[header.graph_offset + 10] ^= 0x01
    saved.write_bytes(bytes(raw))
    with pytest.raises(ProgramFormatError, match="checksum"):
        Program.read(saved, verify_weights=False)


def _resident_kib(start: int) -> int:
    """Rss of the mapping that starts at address `start` (Linux's /proc/self/smaps)."""
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            if "-" in line.split()[0] and ":" not in line.split()[0]:
                inside = int(line.split("-")[0], 16) == start
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED") or not os.path.exists("/proc/self/smaps"),
                    reason="Linux's madvise and smaps")
def test_verified_and_touched_weights_give_their_pages_back_and_still_read_the_same(tmp_path) -> None:
    """Verifying the weights touches every page; a read gives them back as it hashes (the program's mapped
    weights are not resident twice beside a backend's copies), and `drop_resident_weights` again after
    they are touched. The values read afterwards are the file's."""
    from edgerun.ir.dtypes import DType
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(6)]  # 24 MiB
    graph = Graph()
    x = graph.add_input("x", TensorSpec((1024,), DType.float32))
    graph.outputs = [x]
    for k, w in enumerate(weights):
        graph.add_constant(w, name=f"w{k}")
    path = tmp_path / "big.edgr"
    Program(graph).save(path)
    program = Program.read(path)
    start = np.frombuffer(_root_buffer(program.graph.constants["w0"]), np.uint8).ctypes.data
    assert _resident_kib(start) < 4 * 1024  # not the 24 MiB the hash read
    assert sum(float(program.graph.constants[f"w{k}"].sum()) for k in range(6)) == pytest.approx(
        sum(float(w.sum()) for w in weights), rel=1e-6)
    assert _resident_kib(start) > 20 * 1024  # touched again: mapped again from the file
    program.drop_resident_weights()
    assert _resident_kib(start) < 1024
    for k, w in enumerate(weights):
        np.testing.assert_array_equal(program.graph.constants[f"w{k}"], w)


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED") or not os.path.exists("/proc/self/smaps"),
                    reason="Linux's madvise and smaps")
def test_pages_touched_inside_weights_given_back_are_given_back_while_it_runs(tmp_path) -> None:
    """What a backend reads while it compiles (inside `weights_given_back`) does not stay resident until the
    end: the helper thread gives it back as it goes."""
    from edgerun.ir.dtypes import DType
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec

    graph = Graph()
    graph.outputs = [graph.add_input("x", TensorSpec((4,), DType.float32))]
    weight = np.random.default_rng(1).standard_normal((2048, 1024)).astype(np.float32)  # 8 MiB
    graph.add_constant(weight, name="w")
    path = tmp_path / "w.edgr"
    Program(graph).save(path)
    program = Program.read(path)
    start = np.frombuffer(_root_buffer(program.graph.constants["w"]), np.uint8).ctypes.data
    with program.weights_given_back(every_s=0.005):
        assert float(program.graph.constants["w"].sum()) == pytest.approx(float(weight.sum()), rel=1e-5)
        deadline = time.monotonic() + 10.0
        while _resident_kib(start) > 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_kib(start) <= 1024  # given back while the block still runs
    np.testing.assert_array_equal(program.graph.constants["w"], weight)
