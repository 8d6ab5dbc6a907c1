"""The loaded template: specialisations cached by binding in a bounded LRU, the LoadedProgram calling API,
and static programs untouched by any of it."""

from __future__ import annotations

import numpy as np
import pytest

import edgerun
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import sym
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.runtime import LoadedProgram, RunnableProgram
from edgerun.runtime import load as runtime_load
from edgerun.runtime.specializing import SpecializingProgram, specialize_program

N = sym("n")


def _template() -> Program:
    g = Graph(symbols={"n": (1, 64)})
    b = Builder(g)
    x = g.add_input("x", TensorSpec((N, 4), DType.float32))
    w = b.const(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = b.emit("linear", [x, w])
    z = b.emit("transpose", [b.emit("softmax", [y], axis=0)], perm=[1, 0])
    g.outputs = [z, b.emit("reshape", [y], shape=[-1])]
    return Program(g, {"producer": "test"})


def _expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = x @ np.arange(12, dtype=np.float32).reshape(3, 4).T
    e = np.exp(y - y.max(0))
    return (e / e.sum(0)).T, y.reshape(-1)


def test_calls_at_several_shapes_match_numpy_and_share_one_cache(tmp_path) -> None:
    _template().save(tmp_path / "t.edgerun")
    model = edgerun.load(tmp_path / "t.edgerun")
    # It holds loaded programs (one per shape) and is not one: a RunnableProgram, as a LoadedProgram is.
    assert isinstance(model, SpecializingProgram) and isinstance(model, RunnableProgram)
    assert not isinstance(model, LoadedProgram) and not hasattr(model, "parts")
    assert model.symbols == {"n": (1, 64)} and model.output_names == model.graph.outputs
    assert str(model.output_specs[model.output_names[1]]) == "float32[3*n]"
    for n in (1, 5, 64, 5):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        for ours, want in zip(model(x), _expected(x)):
            np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)
        assert model.run({"x": x})[1].shape == (3 * n,)
    assert model.specializations_made == 3
    assert model.cached_bindings == [{"n": 1}, {"n": 64}, {"n": 5}]


def test_lru_evicts_the_least_recently_used_shape() -> None:
    template = _template()
    loads: list[int] = []

    def load_concrete(p: Program) -> LoadedProgram:
        loads.append(p.graph.specs["x"].shape[0])
        return runtime_load(p)

    model = SpecializingProgram(template, load_concrete, cache_size=2)
    for n in (2, 3, 2, 4, 3):
        model(np.ones((n, 4), np.float32))
    # 2, 3 loaded; 2 hit (3 is now oldest); 4 evicts 3; 3 loads again and evicts 2.
    assert loads == [2, 3, 4, 3]
    assert model.cached_bindings == [{"n": 4}, {"n": 3}]
    with pytest.raises(EdgerunError, match="cache_size must be at least 1"):
        SpecializingProgram(template, load_concrete, cache_size=0)


def test_specialised_program_is_the_normal_pipeline_output() -> None:
    concrete = specialize_program(_template(), {"n": 7})
    assert not concrete.graph.symbols
    assert concrete.metadata["specialized_from"] == {"symbols": {"n": 7}}
    assert concrete.metadata["passes"][0]["name"] == "decompose"  # the export pipeline ran on it
    assert "transpose" not in concrete.graph.op_counts()  # layout composites lowered to rasters
    assert "softmax" in concrete.graph.op_counts()  # program composites kept for the backends to claim


def test_per_shape_attributes_point_to_a_specialisation() -> None:
    model = edgerun.load(_template())
    with pytest.raises(AttributeError, match=r"no attribute 'plan'.*model\.specialization"):
        _ = model.plan
    with pytest.raises(AttributeError, match=r"template program .* no attribute 'instructions'"):
        _ = model.instructions
    loaded = model.specialization(x=(9, 4))
    assert loaded.graph.specs[loaded.graph.inputs[0]].shape == (9, 4)
    assert "n in [1, 64]" in repr(model)


def test_static_programs_take_the_static_path() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 4), DType.float32))
    g.outputs = [b.emit("relu", [x])]
    assert type(edgerun.load(Program(g))) is LoadedProgram
    assert type(edgerun.load(g, backends="auto")) is LoadedProgram


def test_info_on_a_template_shows_symbols_and_the_largest_shapes_plan(tmp_path, capsys) -> None:
    from edgerun.cli import main

    _template().save(tmp_path / "t.edgerun")
    assert main(["info", str(tmp_path / "t.edgerun")]) == 0
    out = capsys.readouterr().out
    assert "input  x: float32[n,4]" in out
    assert "template: symbols n in [1, 64]" in out and "largest shape (n=64)" in out
    assert "arena / bound" in out
