"""A self-contained HTML report: inline SVG plots and tables, no script, nothing fetched.

Plots: time by op type (bars), the instruction timeline (one lane per backend), and, when an inspect report
is given, the error by layer (log10 of each node's max abs error against the reference, in execution order,
the first divergence marked). Every plot is an <svg> with an id (plot-op-time, plot-timeline, plot-error)
and its marks carry a class (bar, span, point), which is what the headless-browser test counts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from edgerun.devtools.inspect import InspectReport
from edgerun.devtools.profile import Profile

_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac")
_WIDTH = 900


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def bar_chart(svg_id: str, items: Sequence[tuple[str, float]], unit: str) -> str:
    if not items:
        return f'<svg id="{svg_id}" width="{_WIDTH}" height="20"></svg>'
    row, label_w = 22, 160
    top = max(v for _, v in items) or 1.0
    height = row * len(items) + 10
    parts = [f'<svg id="{svg_id}" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}">']
    for k, (name, value) in enumerate(items):
        y = 5 + k * row
        w = max(1.0, (_WIDTH - label_w - 120) * value / top)
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{_esc(name)}</text>'
                     f'<rect class="bar" x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 6}" '
                     f'fill="{_PALETTE[k % len(_PALETTE)]}"><title>{_esc(name)}: {value:.4g} {unit}</title></rect>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" font-size="12">{value:.4g} {unit}</text>')
    parts.append("</svg>")
    return "".join(parts)


def timeline(profile: Profile) -> str:
    lanes = sorted({i.backend for i in profile.instructions})
    ops = sorted({i.op for i in profile.instructions})
    colour = {op: _PALETTE[k % len(_PALETTE)] for k, op in enumerate(ops)}
    label_w, lane_h = 120, 28
    end = max((i.start_s + i.seconds for i in profile.instructions), default=0.0) or 1e-9
    scale = (_WIDTH - label_w - 10) / end
    height = lane_h * len(lanes) + 30
    parts = [f'<svg id="plot-timeline" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}">']
    for k, lane in enumerate(lanes):
        parts.append(f'<text x="{label_w - 6}" y="{k * lane_h + 18}" text-anchor="end" font-size="12">'
                     f'{_esc(lane)}</text>')
    for i in profile.instructions:
        y = lanes.index(i.backend) * lane_h + 4
        w = max(0.5, i.seconds * scale)
        parts.append(f'<rect class="span" x="{label_w + i.start_s * scale:.2f}" y="{y}" width="{w:.2f}" '
                     f'height="{lane_h - 8}" fill="{colour[i.op]}"><title>#{i.index} {_esc(i.node)} ({_esc(i.op)}, '
                     f'partition {i.partition}): {i.seconds * 1e3:.4f} ms</title></rect>')
    parts.append(f'<text x="{label_w}" y="{height - 6}" font-size="11">0</text>'
                 f'<text x="{_WIDTH - 10}" y="{height - 6}" text-anchor="end" font-size="11">'
                 f'{end * 1e3:.3f} ms</text></svg>')
    return "".join(parts)


def error_plot(report: InspectReport) -> str:
    height, pad = 260, 40
    errs = [(n, n.stats.max_abs if math.isfinite(n.stats.max_abs) and not n.stats.nonfinite_mismatch
             else math.inf) for n in report.nodes]
    finite = [e for _, e in errs if math.isfinite(e) and e > 0]
    lo = math.floor(math.log10(min(finite))) if finite else -12
    hi = math.ceil(math.log10(max(finite))) + 1 if finite else 0
    lo, hi = min(lo, hi - 1), max(hi, lo + 1)
    n = max(len(errs), 2)
    first = report.first_divergent

    def y_of(e: float) -> float:
        v = hi if not math.isfinite(e) else (lo if e <= 0 else math.log10(e))
        return pad / 2 + (height - pad) * (1 - (min(max(v, lo), hi) - lo) / (hi - lo))
    parts = [f'<svg id="plot-error" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}">',
             f'<line x1="{pad}" y1="{height - pad / 2}" x2="{_WIDTH - 10}" y2="{height - pad / 2}" stroke="#888"/>',
             f'<text x="4" y="{pad / 2 + 4}" font-size="11">1e{hi}</text>',
             f'<text x="4" y="{height - pad / 2}" font-size="11">≤1e{lo}</text>']
    for k, (node, e) in enumerate(errs):
        x = pad + (_WIDTH - pad - 20) * k / (n - 1)
        fill = "#e15759" if not node.stats.passed else "#4e79a7"
        r = 5 if node is first else 2.5
        shown = "non-finite" if not math.isfinite(e) else f"{e:.3g}"
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y_of(e):.1f}" r="{r}" fill="{fill}">'
                     f'<title>#{node.index} {_esc(node.node)} ({_esc(node.op)}): max abs {shown}, '
                     f'SNR {node.stats.snr_db:.1f} dB</title></circle>')
        if node is first:
            anchor, dx = ("end", -8) if x > _WIDTH * 0.6 else ("start", 8)
            parts.append(f'<text x="{x + dx:.1f}" y="{y_of(e) + 16:.1f}" font-size="12" fill="#e15759" '
                         f'text-anchor="{anchor}">first divergence: {_esc(node.node)} ({_esc(node.op)})</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(profile: Profile, inspect_report: InspectReport | None = None, title: str = "edgerun report") -> str:
    by_op = list(profile.by("op").items())
    by_backend = list(profile.by("backend").items())
    body = [f"<h1>{_esc(title)}</h1>",
            f"<p>{len(profile.instructions)} instructions on {_esc(', '.join(profile.backends))}; median run "
            f"{profile.median_run_s * 1e3:.3f} ms over {len(profile.run_seconds)} runs; "
            f"{len(profile.transfers)} transfers between backends "
            f"({sum(t.nbytes for t in profile.transfers)} B).</p>",
            "<h2>Time by op type</h2>", bar_chart("plot-op-time", [(k, v * 1e3) for k, v in by_op], "ms"),
            "<h2>Time by backend</h2>", bar_chart("plot-backend-time", [(k, v * 1e3) for k, v in by_backend], "ms"),
            "<h2>Timeline</h2>", timeline(profile)]
    if inspect_report is not None:
        body += ["<h2>Error by layer against the reference</h2>",
                 *(f"<p>{_esc(line)}</p>" for line in inspect_report.summary().splitlines()),
                 "<p>log10 of each value's max abs error, in execution order; exact matches sit on the "
                 "bottom line, non-finite mismatches on the top one; red: out of tolerance.</p>",
                 error_plot(inspect_report)]
    rows = "".join(f"<tr><td>{i.index}</td><td>{_esc(i.node)}</td><td>{_esc(i.op)}</td><td>{_esc(i.backend)}</td>"
                   f"<td>{i.partition}</td><td>{i.seconds * 1e3:.4f}</td></tr>"
                   for i in sorted(profile.instructions, key=lambda i: -i.seconds)[:30])
    body += ["<h2>Top instructions</h2>", "<table><tr><th>#</th><th>node</th><th>op</th><th>backend</th>"
             f"<th>partition</th><th>ms</th></tr>{rows}</table>"]
    style = ("body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;font-size:12px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_html(path: str, profile: Profile, inspect_report: InspectReport | None = None,
               title: str = "edgerun report") -> None:
    with open(path, "w") as fh:
        fh.write(render_html(profile, inspect_report, title))
