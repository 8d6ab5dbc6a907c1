"""docs/benchmarks.md is the rendering of bench/results/*.json by bench/benchmarks_page.py, never stale."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _page_module():
    spec = importlib.util.spec_from_file_location("benchmarks_page", ROOT / "bench" / "benchmarks_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without_dates(page: str) -> str:
    # A results file's date is its last commit's: the page written in the same commit still says so.
    return re.sub(r"\b\d{4}-\d{2}-\d{2}\b|\buncommitted\b", "DATE", page)


def test_the_page_renders_every_results_file_as_it_is() -> None:
    page = _page_module()
    want = page.render(date_of=lambda _path: "uncommitted")
    assert _without_dates((ROOT / "docs" / "benchmarks.md").read_text()) == _without_dates(want), (
        "docs/benchmarks.md is stale: run `PYTHONPATH=$PWD .venv/bin/python bench/benchmarks_page.py`")
    for f in (ROOT / "bench" / "results").glob("*.json"):
        assert f"## {f.stem}\n" in want


def test_a_results_file_becomes_a_table_with_its_command_machine_and_load() -> None:
    page = _page_module()
    data = {"command": "bench/x.py --runs 3", "machine": "x86_64", "load_average": [1.5, 1.25, 1.0],
            "rows": [{"model": "a", "ms": {"ours": 1.0, "peer": 2.5}}, {"model": "b", "ms": {"ours": 3.0}}]}
    assert page._script_command("x", data) == "bench/x.py --runs 3"
    assert page._machine(data) == "x86_64" and page._load(data) == "1.500 / 1.250 / 1.000"
    [(title, rows)] = list(page.tables(data))
    assert title == "rows" and rows[0] == {"model": "a", "ms.ours": 1.0, "ms.peer": 2.5}
    assert page._markdown_table(rows)[2:] == ["| a | 1.000 | 2.500 |", "| b | 3.000 |  |"]
