"""The client API against a real `edgerun serve` process: TAPML Fig. 6 in our terms."""

from __future__ import annotations

import numpy as np
import pytest
from remote_testkit import ServerProcess

import edgerun
from edgerun.errors import EdgerunError, RemoteError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program


def _mlp_program() -> Program:
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 8), "float32"))
    w = b.const(rng.standard_normal((16, 8)).astype(np.float32))
    h = b.emit("gelu", [b.emit("linear", [x, w])])
    g.outputs = [b.emit("softmax", [h], axis=-1)]
    return Program(graph=g)


def test_upload_tensor_empty_function_out_and_fetch(server: ServerProcess) -> None:
    program = _mlp_program()
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    want = edgerun.load(program)(x)
    with edgerun.connect(server.url, server.token, timeout=30) as remote:
        assert remote.info["backends"] == ["reference"]
        name = remote.upload(program, name="mlp")
        assert name == "mlp"
        xt = remote.tensor(x)
        out = remote.empty((4, 16), "float32")
        remote.function("mlp")(xt, out=out)
        np.testing.assert_array_equal(out.numpy(), want)
        uploaded_out = remote.tensor(np.zeros((4, 16), np.float32))  # received frames are read-only views
        remote.function("mlp")(xt, out=uploaded_out)
        np.testing.assert_array_equal(uploaded_out.numpy(), want)
        (fetched,) = remote.function("mlp")(x, fetch=True)
        np.testing.assert_array_equal(fetched, want)
        (kept,) = remote.function("mlp")(xt)
        assert kept.shape == (4, 16)
        np.testing.assert_array_equal(kept.numpy(), want)


def test_program_file_upload_and_dtypes_round_trip(server: ServerProcess, tmp_path) -> None:
    path = tmp_path / "mlp.edgerun"
    _mlp_program().save(path)
    with edgerun.connect(server.url, server.token) as remote:
        assert remote.upload(path) == "mlp"
        for arr in (np.arange(7, dtype=np.int8), np.array([[True, False]]), np.float16([1.5, -2]),
                    np.zeros((0, 3), np.int64), np.array(3.25, np.float32)):
            back = remote.tensor(arr).numpy()
            assert back.dtype == arr.dtype and back.shape == arr.shape
            np.testing.assert_array_equal(back, arr)


def test_device_exception_carries_the_device_traceback(server: ServerProcess) -> None:
    with edgerun.connect(server.url, server.token) as remote:
        remote.upload(_mlp_program(), name="mlp")
        with pytest.raises(RemoteError) as info:
            remote.function("mlp")(np.zeros((3, 8), np.float32), fetch=True)
        assert "must have shape (4, 8)" in str(info.value)
        assert "Traceback (most recent call last)" in info.value.remote_traceback
        assert "server.py" in info.value.remote_traceback
        with pytest.raises(RemoteError, match="no function 'nope'"):
            remote.function("nope")(fetch=True)


def test_token_from_environment(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_TOKEN", server.token)
    with edgerun.connect(server.url) as remote:
        assert remote.tensor(np.ones(3, np.float32)).numpy().sum() == 3
    monkeypatch.delenv("EDGERUN_TOKEN")
    with pytest.raises(EdgerunError, match="needs a token"):
        edgerun.connect(server.url)


def test_remote_backend_runs_partitions_on_the_device(server: ServerProcess,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    program = _mlp_program()
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    local = edgerun.load(program)
    want = local(x)
    monkeypatch.setenv("EDGERUN_TOKEN", server.token)
    backend = f"remote:{server.address}"
    remote = edgerun.load(program, backends=[backend])
    np.testing.assert_array_equal(remote(x), want)
    assert {p.backend for p in remote.partitions} == {backend}
