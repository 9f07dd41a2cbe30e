"""The chart of a sweep document (`dflash.bench.sweep.sweep_result`): `python -m dflash sweep --plot` and the Sweep
tab's export. One axis: lines with q25–q75 error bars; two: a heatmap with the median and the sample count in each
cell; three: one heatmap per value of the third, on one colour scale. The best lossless cell and the default cell
are marked. Built on a bare `Figure` (the Agg canvas), so no pyplot state or display is involved.
"""

from __future__ import annotations

import math
import textwrap

from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from dflash.bench.sweep import cell_key

METRICS = {"speedup": "speedup over no draft (×)", "tau": "τ (tokens per verify)", "tok_s": "tokens/s"}
NAMES = {"block_size": "block size", "diffusion_steps": "denoising steps", "confidence_threshold": "confidence threshold",
         "acceptance_threshold": "acceptance threshold", "adaptive": "block policy", "lookup_ngram": "copy n-gram",
         "dtype": "dtype", "temperature": "temperature"}
BEST, OUTLINE, DEFAULT = "#1a7f37", "#111111", "#0b5cad"  # the best lossless cell: a green star, a black outline


def sweep_figure(result: dict, metric: str = "speedup") -> Figure:
    """The chart of `result` for `metric` (speedup, tau or tok_s): see the module docstring."""
    if metric not in METRICS:
        raise ValueError(f"metric: choose from {', '.join(METRICS)}, got {metric!r}")
    axes = result["spec"]["axes"]
    cells = {c["key"]: c for c in result["cells"]}
    marks = {"best": result.get("best"), "default": result.get("default")}
    if len(axes) == 1:
        fig = _lines(axes[0], cells, marks, metric)
    else:
        fig = _heatmaps(axes, cells, marks, metric)
    n = sorted({c["n"] for c in result["cells"]})
    models = result.get("models") or {}
    who = " · ".join(model_name(models[k]) for k in ("target", "draft", "dtype", "device") if models.get(k))
    count = f"n = {n[0]}" if len(n) == 1 else f"n = {n[0]}–{n[-1]}" if n else "no cells measured"
    fig.suptitle(f"{METRICS[metric]}\nmedian of {count} per cell (prompts × repeats)", fontsize=10)
    fig.supxlabel("\n".join(legend(marks)) + (f"\n{textwrap.fill(who, 60)}" if who else ""), fontsize=8, color="#444")
    return fig


def model_name(where: object) -> str:
    """A model's file or folder name, not the path it had on the machine that measured."""
    return str(where).rstrip("/").rsplit("/", 1)[-1]


def legend(marks: dict) -> tuple[str, str]:
    """The marks in words: (the best lossless cell's line, the default cell's line); the PNG and the tab's chart."""
    best = f"★ best lossless: {marks['best']}" if marks["best"] else "no lossless cell with identical output (up to ties)"
    default = f"◇ default: {marks['default']}" if marks["default"] else "the default is not in the grid"
    return best, default


def ticks(name: str, values: list) -> list[str]:
    return [f"{v} (off)" if name == "lookup_ngram" and v == 0 else str(v) for v in values]


def _lines(axis: list, cells: dict, marks: dict, metric: str) -> Figure:
    name, values = axis
    fig = Figure(figsize=(max(5.0, 1.0 + 0.8 * len(values)), 4.2), layout="constrained")
    ax = fig.add_subplot()
    found = [(i, cells[cell_key({name: v})]) for i, v in enumerate(values) if cell_key({name: v}) in cells]
    xs, med = [i for i, _ in found], [c[metric][0] for _, c in found]
    spread = [[c[metric][0] - c[metric][1] for _, c in found], [c[metric][2] - c[metric][0] for _, c in found]]
    ax.errorbar(xs, med, yerr=spread, fmt="-o", color="#555", ecolor="#999", capsize=4, label="median, q25–q75")
    for x, m, (_, c) in zip(xs, med, found, strict=True):
        ax.annotate(f"{m:.2f}\nn={c['n']}" + ("\nlossy" if c["lossy"] else ""), (x, m), textcoords="offset points",
                    xytext=(8, 4), fontsize=8)
        if c["key"] == marks["best"]:
            ax.plot([x], [m], marker="*", markersize=18, color=BEST, linestyle="none", label="best lossless")
        if c["key"] == marks["default"]:
            ax.plot([x], [m], marker="D", markersize=12, markerfacecolor="none", markeredgecolor=DEFAULT,
                    markeredgewidth=2, linestyle="none", label="default")
    if metric == "speedup":
        ax.axhline(1.0, color="#c00", linestyle="--", linewidth=1, label="no draft")
    ax.set_xticks(range(len(values)), ticks(name, values))
    ax.set_xlim(-0.4, len(values) - 0.3)  # room for the last point's numbers
    ax.set_xlabel(NAMES.get(name, name))
    ax.set_ylabel(METRICS[metric])
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def cell_grids(axes: list, cells: dict) -> tuple[list, list]:
    """Two or three axes → (facets, grids): the third axis's (name, value) per panel (one None panel for two axes),
    and per panel the cells [y][x] (None: not measured). The playground's interactive chart draws the same grids."""
    (xn, xv), (yn, yv) = axes[0], axes[1]
    facets = [(axes[2][0], f) for f in axes[2][1]] if len(axes) == 3 else [None]
    return facets, [[[_cell(cells, xn, x, yn, y, facet) for x in xv] for y in yv] for facet in facets]


def _heatmaps(axes: list, cells: dict, marks: dict, metric: str) -> Figure:
    (xn, xv), (yn, yv) = axes[0], axes[1]
    facets, grids = cell_grids(axes, cells)
    found = [c[metric][0] for g in grids for row in g for c in row if c is not None]
    norm = _norm(found, metric)
    cols = min(len(facets), 3)
    rows = math.ceil(len(facets) / cols)
    fig = Figure(figsize=(cols * max(3.6, 1.2 + 0.9 * len(xv)), rows * max(3.0, 1.0 + 0.6 * len(yv)) + 0.6),
                 layout="constrained")
    image = None
    for k, (facet, grid) in enumerate(zip(facets, grids, strict=True)):
        ax = fig.add_subplot(rows, cols, k + 1)
        data = [[c[metric][0] if c is not None else math.nan for c in row] for row in grid]
        image = ax.imshow(data, cmap="RdYlGn" if metric == "speedup" else "viridis", norm=norm, aspect="auto",
                          origin="lower")
        for i, row in enumerate(grid):
            for j, c in enumerate(row):
                _annotate(ax, image, j, i, c, marks, metric)
        ax.set_xticks(range(len(xv)), ticks(xn, xv))
        ax.set_yticks(range(len(yv)), ticks(yn, yv))
        ax.set_xlabel(NAMES.get(xn, xn))
        ax.set_ylabel(NAMES.get(yn, yn))
        if facet is not None:
            ax.set_title(facet_title(facet), fontsize=10)
    if image is not None and found:
        fig.colorbar(image, ax=fig.axes, shrink=0.85, label=METRICS[metric])
    return fig


def facet_title(facet: tuple) -> str:
    return f"{NAMES.get(facet[0], facet[0])} = {ticks(facet[0], [facet[1]])[0]}"


def _cell(cells: dict, xn: str, x, yn: str, y, facet: tuple | None) -> dict | None:
    setting = {xn: x, yn: y, **({facet[0]: facet[1]} if facet else {})}
    return cells.get(cell_key(setting))


def value_range(values: list[float], metric: str) -> tuple[float, float]:
    """The colour scale's ends. Speedup: centred on 1, so that red is slower than no draft and green faster
    (all cells faster: all green); else the values' own range."""
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if metric == "speedup":
        span = max(hi - 1.0, 1.0 - lo, 0.05)
        return 1.0 - span, 1.0 + span
    return lo, hi if hi > lo else lo + 1e-9


def _norm(values: list[float], metric: str) -> Normalize:
    return Normalize(*value_range(values, metric))


def _annotate(ax, image, x: int, y: int, c: dict | None, marks: dict, metric: str) -> None:
    """The median and n in a heatmap cell (dark or light text for its colour); the best and default outlined."""
    if c is None:
        ax.text(x, y, "not\nmeasured", ha="center", va="center", fontsize=7, color="#777")
        return
    m = c[metric][0]
    r, g, b, _ = image.cmap(image.norm(m))
    color = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
    star = "★ " if c["key"] == marks["best"] else ""
    unit = "×" if metric == "speedup" else ""
    ax.text(x, y, f"{star}{m:.2f}{unit}\nn={c['n']}" + ("\nlossy" if c["lossy"] else ""), ha="center", va="center",
            fontsize=8, color=color)
    for key, edge, style, half in ((marks["best"], OUTLINE, "-", 0.46), (marks["default"], DEFAULT, "--", 0.38)):
        if c["key"] == key:  # the default's outline inside the best's, where one cell is both
            ax.add_patch(Rectangle((x - half, y - half), 2 * half, 2 * half, fill=False, edgecolor=edge, linewidth=2.5,
                                   linestyle=style))
