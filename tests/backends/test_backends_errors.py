"""Clear errors: a backend that is not installed names its extra, and everything still runs on reference;
a partition ONNX Runtime cannot compile falls back to reference with a warning, never a crash."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgerun.backends.base import OpSupport
from edgerun.backends.registry import register_backend, unregister_backend
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.search import load

WITHOUT_ORT = textwrap.dedent("""
    import sys, warnings
    sys.modules["onnxruntime"] = None  # as if the extra were not installed
    import numpy as np
    from edgerun import BackendUnavailableError, load
    from edgerun.ir.builder import Builder
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec
    from edgerun.ir.dtypes import DType
    g = Graph(); b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 3), DType.float32))
    g.outputs = [b.emit("tanh", [b.emit("add", [x, x])])]
    try:
        load(g, ["onnxruntime"])
    except BackendUnavailableError as exc:
        print("ERROR:", exc)
    m = load(g, backends="auto")
    print("AUTO:", sorted({p.backend for p in m.partitions}))
    print("OK:", bool(np.allclose(m(np.ones((2, 3), np.float32)), np.tanh(2.0))))
""")


def test_missing_onnxruntime_names_the_extra_and_auto_runs_on_reference(tmp_path: pytest.TempPathFactory) -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_ORT], capture_output=True, text=True, timeout=120,
                          env={"EDGERUN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert "pip install edgerun[onnxruntime]" in lines["ERROR"]
    assert lines["AUTO"] == "['reference']"
    assert lines["OK"] == "True"


def test_partition_the_delegate_cannot_compile_falls_back_with_a_warning() -> None:
    ort = pytest.importorskip("edgerun.backends.onnxruntime")

    class OverclaimingOrt(ort.OnnxRuntimeBackend):  # type: ignore[misc, name-defined]
        """Claims `where` on bool values, which ONNX Runtime has no CPU kernel for: its compile really fails."""
        name = "ort-overclaiming"
        supported = {**ort.OnnxRuntimeBackend.supported, "where": OpSupport()}

    register_backend("ort-overclaiming", OverclaimingOrt, replace=True)
    try:
        g = Graph()
        b = Builder(g)
        cond = g.add_input("c", TensorSpec((4,), DType.bool))
        a = g.add_input("a", TensorSpec((4,), DType.bool))
        g.outputs = [b.emit("logical_not", [b.emit("where", [cond, a, b.emit("logical_not", [a])])])]
        with pytest.warns(RuntimeWarning, match="failed to compile"):
            m = load(g, ["ort-overclaiming"])
        assert {p.backend for p in m.partitions} == {"reference"}
        c = np.array([True, False, True, False])
        v = np.array([True, True, False, False])
        np.testing.assert_array_equal(m(c, v), ~np.where(c, v, ~v))
    finally:
        unregister_backend("ort-overclaiming")


def test_unknown_backend_name_lists_the_known_ones() -> None:
    from edgerun import BackendUnavailableError

    g = Graph()
    x = g.add_input("x", TensorSpec((2,), DType.float32))
    g.outputs = [Builder(g).emit("neg", [x])]
    with pytest.raises(BackendUnavailableError, match="known backends"):
        load(g, backends="auto:no_such_backend")
    # The runtime itself does not search: "auto" is the search's to resolve, and it says where to go.
    from edgerun.runtime import load as runtime_load

    with pytest.raises(EdgerunError, match=r"edgerun\.load"):
        runtime_load(g, backends="auto")
