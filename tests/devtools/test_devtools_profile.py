"""profile: per-instruction table, Chrome trace JSON, and a self-contained HTML report that renders in
headless Chromium with its plots drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from devtools_testkit import write_proof_program

from edgerun.backends.faulty import FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.cli import main
from edgerun.devtools.fault_proof import proof_loaded, realistic_inputs
from edgerun.devtools.html_report import render_html
from edgerun.devtools.inspect import inspect_program
from edgerun.devtools.profile import Profile, profile_program
from edgerun.devtools.trace import chrome_trace


@pytest.fixture(scope="module")
def hybrid_profile() -> Profile:
    loaded = proof_loaded()
    placement = {n.name: "faulty" for n in loaded.graph.nodes if n.op in ("matmul", "tanh")}
    return profile_program(loaded, [get_backend("reference"), FaultyBackend("none")], realistic_inputs(1)[0],
                           placement=placement, repeat=3)


def test_profile_names_backend_and_partition_of_every_instruction(hybrid_profile: Profile) -> None:
    p = hybrid_profile
    assert {i.backend for i in p.instructions} == {"reference", "faulty"}
    assert all(i.backend == "faulty" for i in p.instructions if i.op in ("matmul", "tanh"))
    assert len({i.partition for i in p.instructions}) > 2 and len(p.run_seconds) == 3
    assert all(i.seconds > 0 for i in p.instructions)
    assert p.transfers and all(t.src_backend != t.dst_backend for t in p.transfers)
    text = p.table()
    for heading in ("top 15 instructions", "time by op type", "time by backend", "transfers between backends"):
        assert heading in text
    assert abs(sum(p.by("op").values()) - sum(p.by("backend").values())) < 1e-9


def test_chrome_trace_has_one_complete_event_per_instruction(hybrid_profile: Profile) -> None:
    trace = json.loads(json.dumps(chrome_trace(hybrid_profile)))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(hybrid_profile.instructions)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"reference", "faulty"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert [e["ts"] for e in spans] == sorted(e["ts"] for e in spans)


def test_html_is_self_contained(hybrid_profile: Profile) -> None:
    report = inspect_program(proof_loaded(), FaultyBackend("tanh_nan"), realistic_inputs(1)[0])
    page = render_html(hybrid_profile, report)
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "src=" not in page
    for plot in ("plot-op-time", "plot-timeline", "plot-error"):
        assert f'id="{plot}"' in page
    assert "first divergence: tanh" in page


@pytest.mark.chromium
def test_cli_html_report_renders_its_plots_in_headless_chromium(tmp_path: Path, browser) -> None:  # type: ignore[no-untyped-def]
    program, inputs = write_proof_program(tmp_path)
    html, trace = tmp_path / "report.html", tmp_path / "trace.json"
    assert main(["profile", program, "--backend", "reference", "--backend", "faulty:exp_range", "--op", "exp",
                 "--op", "matmul", "--inputs", inputs[0], "--repeat", "2", "--trace", str(trace),
                 "--html", str(html), "--inspect"]) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    browser.get(html.as_uri())
    drawn = browser.execute_script("""
        const count = (sel) => Array.from(document.querySelectorAll(sel)).filter(el => {
            const b = el.getBBox(); return b.width > 0 && b.height > 0; }).length;
        const plotted = (id) => { const r = document.getElementById(id).getBoundingClientRect();
            return r.width > 0 && r.height > 0; };
        return {bars: count('#plot-op-time rect.bar'), spans: count('#plot-timeline rect.span'),
                points: count('#plot-error circle.point'),
                visible: ['plot-op-time', 'plot-timeline', 'plot-error'].every(plotted),
                title: document.title,
                first: document.querySelector('#plot-error text[fill="#e15759"]')?.textContent || ''};
    """)
    assert drawn["visible"]
    assert drawn["bars"] >= 5 and drawn["spans"] >= 30 and drawn["points"] >= 30
    assert drawn["first"].startswith("first divergence:") and "exp" in drawn["first"]
    browser.save_screenshot(str(tmp_path / "report.png"))
