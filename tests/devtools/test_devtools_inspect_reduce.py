"""inspect names the first divergent op (not the largest error); reduce shrinks a failing program to it."""

from pathlib import Path

import numpy as np
import pytest
from devtools_testkit import write_proof_program

from edgerun.backends.faulty import FaultyBackend
from edgerun.cli import main
from edgerun.devtools.fault_proof import FAULTY_OP, proof_loaded, realistic_inputs
from edgerun.devtools.inspect import inspect_program
from edgerun.devtools.programs import load_graph, read_inputs
from edgerun.devtools.reduce import reduce_program
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph


@pytest.mark.parametrize("bug", ["raster_stride", "fp16_reduce", "tanh_nan"])
def test_first_divergence_is_the_faulty_node(bug: str) -> None:
    report = inspect_program(proof_loaded(), FaultyBackend(bug), realistic_inputs(1)[0])
    first = report.first_divergent
    assert first is not None and first.op == FAULTY_OP[bug]
    assert all(n.stats.passed for n in report.nodes if n.index < first.index)
    assert report.output_error is not None and not report.output_error.passed


def test_first_divergence_differs_from_the_largest_error() -> None:
    # tanh's NaNs cover the tokens with outliers; the RMS normalisation then spreads them to every element.
    report = inspect_program(proof_loaded(), FaultyBackend("tanh_nan"), realistic_inputs(1)[0])
    assert report.first_divergent is not None and report.largest is not None
    assert report.largest.index > report.first_divergent.index
    assert report.largest.stats.nonfinite_mismatch > report.first_divergent.stats.nonfinite_mismatch
    assert "divergence starts at node" in report.summary()


def test_hybrid_inspect_only_places_the_named_ops() -> None:
    report = inspect_program(proof_loaded(), FaultyBackend("tanh_nan"), realistic_inputs(1)[0], ops=["exp"])
    assert report.passed
    assert {n.backend for n in report.nodes if n.op == "exp"} == {"faulty:tanh_nan"}
    assert {n.backend for n in report.nodes if n.op == "tanh"} == {"reference"}


@pytest.mark.parametrize("bug", ["exp_range", "dequant_uint8"])
def test_reduce_to_the_faulty_node(bug: str) -> None:
    result = reduce_program(proof_loaded(), FaultyBackend(bug), realistic_inputs(1)[0])
    assert [n.op for n in result.graph.nodes] == [FAULTY_OP[bug]]
    assert result.nodes_before > 30 and result.reason.startswith("error")


class CrashOnSoftmaxSum(FaultyBackend):
    """A target that raises on long-enough reduce_sum rows: a crash predicate to reduce against."""

    def compile(self, subgraph: Graph):  # type: ignore[no-untyped-def]
        cp = super().compile(subgraph)
        if any(n.op == "reduce_sum" for n in subgraph.nodes):
            def run(inputs, outputs):  # type: ignore[no-untyped-def]
                raise RuntimeError("kernel launch failed: reduce_sum")
            cp.run, cp.bind_node = run, None
        return cp


def test_reduce_a_crash() -> None:
    loaded = proof_loaded()
    result = reduce_program(loaded, CrashOnSoftmaxSum("none"), realistic_inputs(1)[0], predicate="crash")
    assert [n.op for n in result.graph.nodes] == ["reduce_sum"] and "kernel launch failed" in result.reason
    with pytest.raises(EdgerunError, match="does not crash"):
        reduce_program(loaded, FaultyBackend("tanh_nan"), realistic_inputs(1)[0], predicate="crash")


def test_cli_inspect_and_reduce_save_a_program_that_still_fails(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    program, inputs = write_proof_program(tmp_path)
    assert main(["inspect", program, "--backend", "faulty:raster_stride", "--inputs", inputs[0],
                 "--json", str(tmp_path / "i.json")]) == 1
    assert "<- first divergence" in capsys.readouterr().out
    assert main(["inspect", program, "--backend", "reference", "--inputs", inputs[0]]) == 0
    out = str(tmp_path / "reduced.erp")
    assert main(["reduce", program, "--backend", "faulty:tanh_nan", "--inputs", inputs[0], "-o", out]) == 0
    reduced = load_graph(out)
    assert [n.op for n in reduced.graph.nodes] == ["tanh"]
    feed = read_inputs(f"{out}.inputs.npz", reduced.graph)
    assert max(float(np.max(v)) for v in feed.values()) > 44  # the inputs that trigger it came along
    assert main(["inspect", out, "--backend", "faulty:tanh_nan", "--inputs", f"{out}.inputs.npz"]) == 1
    assert main(["inspect", out, "--backend", "reference", "--inputs", f"{out}.inputs.npz"]) == 0
