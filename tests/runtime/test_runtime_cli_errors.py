"""Every command's errors are one line naming the file or input, never a traceback (`edgerun.cli.main`, as the
console script calls it); and the notes and progress lines a newcomer needs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from runtime_testkit import small_transformer_block

from edgerun.cli import main
from edgerun.cli.progress import Progress
from edgerun.passes.pipeline import optimize
from edgerun.program import Program


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    graph, _ = optimize(small_transformer_block())
    program = tmp_path / "block.edgerun"
    Program(graph, {"name": "block"}).save(program)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **{n: np.zeros(graph.specs[n].shape, graph.specs[n].dtype) for n in graph.inputs})
    notes = tmp_path / "notes.txt"
    notes.write_text("not arrays\n")
    return {"program": program, "inputs": inputs, "notes": notes, "dir": tmp_path}


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgerun: error: "), err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["info", "{missing}"], ["run", "{missing}", "--random"], ["plan", "{missing}"],
    ["carve", "{missing}", "--inputs", "{inputs}", "-o", "{dir}/b.bundle"],
    ["inspect", "{missing}", "--backend", "reference", "--inputs", "{inputs}"],
    ["migrate", "{missing}", "--from", "reference", "--to", "reference", "--inputs", "{inputs}"],
    ["reduce", "{missing}", "--backend", "reference", "--inputs", "{inputs}", "-o", "{dir}/s.edgerun"],
    ["quantize", "{missing}", "-o", "{dir}/q.edgerun", "--scheme", "int8-dynamic"],
], ids=lambda a: a[0])
def test_a_typed_wrong_program_path_is_one_line_naming_it(argv: list[str], files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fill = {"missing": str(files["dir"] / "nope.edgerun"), "inputs": str(files["inputs"]), "dir": str(files["dir"])}
    assert "nope.edgerun" in _error(capsys, [a.format(**fill) for a in argv])


def test_inputs_that_are_missing_or_not_arrays_are_named(files: dict[str, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    program, notes = str(files["program"]), str(files["notes"])
    assert "no inputs file at" in _error(capsys, ["run", program, "--inputs", str(files["dir"] / "nope.npz")])
    for argv in (["run", program, "--inputs", notes], ["carve", program, "--inputs", notes, "-o",
                                                       str(files["dir"] / "c.bundle")]):
        line = _error(capsys, argv)
        assert f"{notes} is not an .npz of arrays" in line and "pickled" not in line


def test_check_given_a_program_file_or_nothing_says_what_a_bundle_is(files: dict[str, Path],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, ["check", str(files["program"]), "--backend", "reference"])
    assert "is a file, not a test bundle" in line and "block.edgerun" in line
    assert "no test bundle at" in _error(capsys, ["check", str(files["dir"] / "none.bundle"), "--backend", "reference"])


def test_migrate_says_when_it_replaces_an_earlier_report(files: dict[str, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["migrate", str(files["program"]), "--from", "reference", "--to", "reference", "--inputs",
            str(files["inputs"]), "--report-dir", str(files["dir"] / "report")]
    assert main(argv) == 0
    assert "replacing" not in capsys.readouterr().err
    assert main(argv) == 0
    assert f"replacing the earlier report in {files['dir'] / 'report'}/" in capsys.readouterr().err


def test_quantizing_an_already_quantized_program_is_refused(files: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    once = files["dir"] / "int4.edgerun"
    assert main(["quantize", str(files["program"]), "-o", str(once), "--scheme", "int4-weight",
                 "--group-size", "32"]) == 0
    capsys.readouterr()
    line = _error(capsys, ["quantize", str(once), "-o", str(files["dir"] / "twice.edgerun"), "--scheme", "int4-weight"])
    assert f"{once} is already quantized" in line and "matmul_int4" in line
    assert not (files["dir"] / "twice.edgerun").exists()


def test_plan_names_its_two_timings_apart(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(files["program"])]) == 0
    out = capsys.readouterr().out
    assert "profiled now ms" in out and "measured ms" not in out


def test_a_task_without_schedule_or_trigger_is_noted_when_packed(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    task = tmp_path / "idle"
    task.mkdir()
    (task / "task.json").write_text(json.dumps({"name": "idle", "version": 1, "entry": "main.py"}))
    (task / "main.py").write_text("def run(inputs):\n    return {}\n")
    assert main(["task", "pack", str(task), "-o", str(tmp_path / "idle.tar")]) == 0
    assert "note: idle has no schedule and no triggers" in capsys.readouterr().out
    (task / "task.json").write_text(json.dumps({"name": "idle", "version": 2, "entry": "main.py",
                                                "schedule": {"every_s": 5}}))
    assert main(["task", "pack", str(task), "-o", str(tmp_path / "idle-2.tar")]) == 0
    assert "note:" not in capsys.readouterr().out


def test_onnx_shapes_need_no_flag_and_a_bad_one_is_said_in_cli_terms(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Dynamic dimensions import with no flag; a wrong --input-shape is one line naming the flag (the same
    mistake through from_onnx names its argument); --require-shapes asks for every size."""
    helper = pytest.importorskip("onnx.helper")
    onnx = pytest.importorskip("onnx")
    from edgerun.frontends.onnx import InputShapeError, from_onnx

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, None])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, None])])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph), str(path))
    out = str(tmp_path / "dyn.edgerun")
    assert main(["import-onnx", str(path), "-o", out]) == 0
    assert "N in [1, 16777216], x_2 in [1, 16777216]" in capsys.readouterr().out
    line = _error(capsys, ["import-onnx", str(path), "-o", out, "--input-shape", "x=2,3"])
    assert str(path) in line and "--input-shape x=...: has 2 dimensions, the model's input 3" in line
    assert "input_shapes" not in line
    line = _error(capsys, ["import-onnx", str(path), "-o", out, "--input-shape", "x=N:1:4,5,7"])
    assert "--input-shape x=...: dimension 1 is 5, but the model fixes that dimension to 3" in line
    line = _error(capsys, ["import-onnx", str(path), "-o", out, "--input-shape", "y=1,3,4"])
    assert "--input-shape y=...: names no graph input (the model's are ['x'])" in line
    line = _error(capsys, ["import-onnx", str(path), "-o", out, "--input-shape", "x=H:1:4,H:1:8,1"])
    assert "--input-shape x=...: dimension 1 bounds symbol 'H' by 1..8, elsewhere by 1..4" in line
    with pytest.raises(InputShapeError, match=r"^input_shapes\['x'\] has 2 dimensions, the model's input 3$"):
        from_onnx(str(path), input_shapes={"x": (2, 3)})
    line = _error(capsys, ["import-onnx", str(path), "-o", out, "--require-shapes"])
    assert str(path) in line and "input 'x' has dynamic dimensions 0 ('N'), 2" in line
    assert "--input-shape x=D0,3,D2" in line and "unsupported operator" not in line and "input_shapes=" not in line


def test_progress_is_silent_for_a_quick_step_and_says_a_long_one() -> None:
    quick = io.StringIO()
    with Progress("loading quick", after_s=60.0, stream=quick):
        pass
    assert quick.getvalue() == ""
    slow = io.StringIO()
    with Progress("loading slow", after_s=0.0, every_s=60.0, stream=slow) as p:
        assert p.said.wait(30)  # the step is "long": it outlasts after_s = 0
    lines = slow.getvalue().splitlines()
    assert lines[0] == "loading slow ..." and lines[-1].startswith("loading slow: done in ")
