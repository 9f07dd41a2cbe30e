"""The Sweep tab's chart: the same chart as `python -m dflash sweep --plot` (dflash/bench/sweep_plot.py draws the PNG
with matplotlib), here in plotly so that hovering a cell or point gives its numbers and sample count. One axis:
lines with q25–q75 error bars; two: a heatmap; three: one heatmap per value of the third, on one colour scale. The
best lossless cell carries a star, the default a diamond."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dflash.bench.sweep import cell_key
from dflash.bench.sweep_plot import METRICS, NAMES, cell_grids, facet_title, legend, ticks, value_range


def hover(c: dict, metric: str) -> str:
    """One cell's numbers: the metric's median and quartiles, the sample count, and the output checks."""
    med, lo, hi = c[metric]
    same = "identical to no draft" if c["identical"] else f"differs ({c['ties']} numerical ties)"
    lossy = f"<br>lossy: {c['drift_tokens']} drift tokens" if c.get("lossy") else ""
    return (f"{html.escape(c['key'])}<br>{METRICS[metric]}: {med:.2f} (q25–q75 {lo:.2f}–{hi:.2f})"
            f"<br>n = {c['n']} (prompts × repeats)<br>{same}{lossy}")


def _mark(c: dict | None, marks: dict) -> str:
    if c is None:
        return ""
    return ("★" if c["key"] == marks["best"] else "") + ("◇" if c["key"] == marks["default"] else "")


def _lines(axis: list, cells: dict, marks: dict, metric: str) -> go.Figure:
    name, values = axis
    found = [(t, cells[cell_key({name: v})]) for t, v in zip(ticks(name, values), values) if cell_key({name: v}) in cells]
    med = [c[metric][0] for _, c in found]
    fig = go.Figure(go.Scatter(
        x=[t for t, _ in found], y=med, mode="lines+markers+text", text=[_mark(c, marks) for _, c in found],
        textposition="top center", textfont={"size": 16}, hovertext=[hover(c, metric) for _, c in found],
        hoverinfo="text", name="median, q25–q75", error_y={
            "type": "data", "symmetric": False, "array": [c[metric][2] - c[metric][0] for _, c in found],
            "arrayminus": [c[metric][0] - c[metric][1] for _, c in found]}))
    if metric == "speedup":
        fig.add_hline(y=1.0, line={"dash": "dash", "color": "#c00", "width": 1}, annotation_text="no draft")
    fig.update_xaxes(title=NAMES.get(name, name), type="category")
    fig.update_yaxes(title=METRICS[metric])
    return fig


def _heatmaps(axes: list, cells: dict, marks: dict, metric: str) -> go.Figure:
    (xn, xv), (yn, yv) = axes[0], axes[1]
    facets, grids = cell_grids(axes, cells)
    lo, hi = value_range([c[metric][0] for g in grids for row in g for c in row if c is not None], metric)
    fig = make_subplots(1, len(facets), subplot_titles=[facet_title(f) if f else "" for f in facets],
                        horizontal_spacing=0.08)
    for k, grid in enumerate(grids):
        z = [[c[metric][0] if c is not None else None for c in row] for row in grid]
        text = [[f"{_mark(c, marks)}{c[metric][0]:.2f}" if c is not None else "not measured" for c in row]
                for row in grid]
        tips = [[hover(c, metric) if c is not None else "not measured" for c in row] for row in grid]
        fig.add_trace(go.Heatmap(
            z=z, x=ticks(xn, xv), y=ticks(yn, yv), text=text, texttemplate="%{text}", hovertext=tips,
            hoverinfo="text", zmin=lo, zmax=hi, showscale=k == 0,
            colorscale="RdYlGn" if metric == "speedup" else "Viridis", colorbar={"title": {"text": METRICS[metric]}}),
            row=1, col=k + 1)
        fig.update_xaxes(title=NAMES.get(xn, xn), type="category", row=1, col=k + 1)
        fig.update_yaxes(title=NAMES.get(yn, yn) if k == 0 else None, type="category", row=1, col=k + 1)
    return fig


def sweep_chart(result: dict | None, metric: Any = "speedup") -> go.Figure | None:
    """The chart of a sweep document for `metric` (speedup, tau or tok_s); None before any cell is measured."""
    if not result or not result.get("cells"):
        return None
    metric = metric if metric in METRICS else "speedup"
    axes, cells = result["spec"]["axes"], {c["key"]: c for c in result["cells"]}
    marks = {"best": result.get("best"), "default": result.get("default")}
    fig = _lines(axes[0], cells, marks, metric) if len(axes) == 1 else _heatmaps(axes, cells, marks, metric)
    best, default = legend(marks)
    fig.update_layout(template="none", height=420, margin={"l": 70, "r": 20, "t": 80, "b": 60},
                      title={"text": f"{METRICS[metric]}, median per cell<br><sup>{html.escape(best)} · "
                                     f"{html.escape(default)} · hover a cell for its numbers</sup>", "x": 0.01})
    return fig
