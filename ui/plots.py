"""Pure figure builders: engine events → plotly figures (block length, acceptance histogram, per-position
acceptance, throughput vs the baseline).

Gradio remounts a plotly figure on every update, so the playground redraws these only at block ends and
keeps axis ranges fixed (they grow in whole chunks) so a redraw doesn't jump. `template="none"` keeps the
JSON small. Every series has a second, non-colour encoding (dash style, marker symbol or bar pattern).
Text from the events (the controller's reasons) is HTML-escaped: plotly draws a few tags (links, bold …) in
annotations and hover labels. Every builder takes a list of events or the RunState they fold into.
Figures are assembled as plain dicts and wrapped without plotly's validation: property-path updates
(`update_layout`, `add_hline`, …) and validation cost ~40 ms per call on a small CPU, too slow for a live view.
"""

from __future__ import annotations

import html
import math
import textwrap
from typing import Any

import plotly.graph_objects as go

from dflash.decode import events as ev
from .render import BLUE, GREEN, GREY, ORANGE, VERMILLION, run_stats
from .run_state import RunState, as_state

X_CHUNK = 20  # the x axis grows in steps of this many blocks
GRID = "rgba(128,128,128,0.2)"
# The resolved "none" template (no theme styling): set explicitly so the unvalidated figures below don't get
# plotly's default template (7 KB per figure) attached when serialised.
NONE_TEMPLATE = go.Figure(layout={"template": "none"}).layout.template.to_plotly_json()


def _axis(title: str, rng: list[float], **kw: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "range": rng, "autorange": False, "showgrid": True, "gridcolor": GRID,
            "zeroline": False, **kw}


def _figure(data: list[dict], title: str, xaxis: dict, yaxis: dict, shapes: list | None = None,
            annotations: list | None = None, height: int = 270, bottom: int = 0, **layout_extra: Any) -> go.Figure:
    # The legend (shown for two series or more) hangs by its top below the x axis's title and the figure grows by its
    # rows, so a legend that wraps never covers the title and the plot area keeps its height; `bottom`: px more under
    # the axis (two lines of tick labels).
    rows = _legend_rows(data) if len(data) > 1 else 0
    grow = LEGEND_ROW_PX * rows + (20 if rows else 0) + bottom
    layout = {"template": NONE_TEMPLATE, "title": {"text": title, "font": {"size": 14}, "x": 0.01}, "height": height + grow,
              "margin": {"l": 52, "r": 12, "t": 36, "b": 44 + grow}, "xaxis": xaxis, "yaxis": yaxis,
              "legend": {"orientation": "h", "y": -(LEGEND_TOP_PX + bottom) / (height - 80), "yanchor": "top", "x": 0},
              "hovermode": "closest", "font": {"size": 11},
              "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)", "transition": {"duration": 0},
              "shapes": shapes or [], "annotations": annotations or [], "modebar": {"remove": MODEBAR_REMOVE, "orientation": "v"},
              **layout_extra}
    # Unvalidated for speed (tests validate every figure with go.Figure(fig.to_dict())).
    return go.Figure({"data": data, "layout": layout}, _validate=False)


# Toolbar buttons with no use on these charts (selections, stepwise zoom); each was a Tab stop for keyboard users, 9
# per chart before. Kept: download, zoom, pan, reset; upright at the right edge, where on a phone (always shown there)
# it covers no part of the title.
MODEBAR_REMOVE = ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"]
LEGEND_ROW_PX, LEGEND_TOP_PX = 20, 52  # one legend row; the legend's top below the plot area (under the axis title)
LEGEND_WIDTH_PX = 400  # what a row holds in the playground's half-width plots (the widest layout's narrowest case)


def _legend_rows(data: list[dict]) -> int:
    """Rows of a horizontal legend: each entry about 6 px per character plus its symbol."""
    widths = [40 + 6 * len(d.get("name", "")) for d in data]
    rows, used = 1, 0
    for w in widths:
        if used and used + w > LEGEND_WIDTH_PX:
            rows, used = rows + 1, 0
        used += w
    return rows


def _note(text: str) -> dict[str, Any]:
    return {"text": text, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False, "font": {"color": GREY}}


def max_block(run: RunState | list) -> int:
    """Largest block size the run could use (for fixed axis ranges)."""
    state = as_state(run)
    st = state.started
    cfg = 1
    if st is not None and st.has_draft:
        cfg = st.request.get("max_block_size") or st.request.get("block_size") or st.trained_block_size or 1
    return max([cfg, 1, state.max_size])


def _plain(text: str) -> str:
    return html.escape(text, quote=False)


# A decision's label on the block-length curve: wrapped, never cut (a cut "probe the cost of size 2 (o…" said nothing),
# up and to the right of its point (to the left near the right edge), clear of the step line's vertical segment.
NOTE_CHARS = 22  # characters a line
NOTE_CHAR_PX, NOTE_PAD_PX = 5.0, 8  # plotly's 9 px font: ~4.8 px a character (measured in Chromium); the label's padding
NARROW_PLOT_PX = 250  # the narrowest chart's plot area: 263 px on a 390 px phone (measured); labels are spaced for it
NOTE_OFFSET = (10, -22)  # px from the point to the label's corner
NOTE_GAP, MAX_NOTES = 0.03, 12  # the share of the axis kept free between two labels; at most this many labels
HEADROOM = 1.5  # the y axis reaches this times the largest block size (+ 0.5): room above the curve for 3-line labels


def note_lines(text: str) -> list[str]:
    return textwrap.wrap(text, NOTE_CHARS) or [""]


def _note_width(d: ev.BlockSize) -> float:
    """The share of the narrowest chart's x axis that `d`'s label takes, with its offset from the point."""
    px = NOTE_CHAR_PX * max(map(len, note_lines(decision(d)))) + NOTE_PAD_PX + NOTE_OFFSET[0]
    return px / NARROW_PLOT_PX


def placed(changes: list, xmax: int) -> list[tuple[ev.BlockSize, str]]:
    """The size changes to write on the curve, each with the side of its point its label takes ("right", or "left"
    near the axis's right end): in block order, each whose label leaves room after the last written one (the cost
    policy changes size every few blocks); every decision stays in the hover text."""
    out, free = [], 0.0
    for d in changes:
        at, width = (d.block - 0.5) / xmax, _note_width(d)
        side = "right" if at + width <= 1 else "left"
        lo = at if side == "right" else at - width
        if lo >= free:
            out.append((d, side))
            free = lo + width + NOTE_GAP
    return out[:MAX_NOTES]


def _decision_note(d: ev.BlockSize, side: str) -> dict[str, Any]:
    sign = 1 if side == "right" else -1
    return {"x": d.block, "y": d.size, "text": "<br>".join(_plain(line) for line in note_lines(decision(d))),
            "showarrow": True, "arrowhead": 2, "ax": sign * NOTE_OFFSET[0], "ay": NOTE_OFFSET[1],
            "xanchor": "left" if sign > 0 else "right", "yanchor": "bottom", "align": "left" if sign > 0 else "right",
            "font": {"size": 9, "color": GREY}, "arrowcolor": GREY}


def decision(d: ev.BlockSize) -> str:
    """A controller's decision as written on the curve: a copied block's reason without the engine's note of where the
    copy came from (the copy controller's own reason follows it), marked as the copy's."""
    return "copy: " + d.reason.split("; ", 1)[-1] if d.source == ev.COPY else d.reason


def _copied(state: RunState) -> bool:
    """Whether the run copied any block from the context (Request.lookup_ngram): the views then split by source."""
    return ev.COPY in state.positions


# Per block source: how its series look (colours match the token stream's: drafted blue, copied green).
# "color": committed-token markers; "bar": bars and the size line (solid or "dash").
SOURCE_STYLE = {ev.DRAFT: {"name": "drafted", "color": VERMILLION, "symbol": "diamond", "bar": BLUE, "pattern": "/",
                           "dash": "solid"},
                ev.COPY: {"name": "copied", "color": GREEN, "symbol": "star", "bar": GREEN, "pattern": ".", "dash": "dot"}}


def _committed_series(verifies: list, source: str | None) -> dict[str, Any]:
    """Markers of tokens committed per verify step: every step (`source` None) or the blocks one source proposed."""
    vs = [v for v in verifies if source is None or v.source == source]
    style = SOURCE_STYLE[source or ev.DRAFT]
    name = "tokens committed (accepted + 1)" + (f", {style['name']} blocks" if source else "")
    return {"type": "scatter", "x": [v.block for v in vs], "y": [v.accepted_len + 1 for v in vs], "mode": "markers",
            "name": name, "marker": {"color": style["color"], "symbol": style["symbol"], "size": 7,
                                     "line": {"width": 1, "color": "#ffffff"}},
            "hovertemplate": "block %{x}: %{y} tokens committed" + (f" ({style['name']})" if source else "") + "<extra></extra>"}


def _size_series(state: RunState, source: str | None) -> dict[str, Any]:
    """The block size per verify step (a step line): of every step (`source` None), or of one source's blocks, each
    source's line holding its own controller's size until its next block."""
    vs = [v for v in state.verifies if source is None or v.source == source]
    sizes = [state.blocks[v.block].size for v in vs]
    style = SOURCE_STYLE[source or ev.DRAFT]
    name = "block size" + (f", {style['name']} blocks" if source else "")
    return {"type": "scatter", "x": [v.block for v in vs], "y": [v.block_size for v in vs], "mode": "lines",
            "line": {"shape": "hv", "color": style["bar"], "width": 2, "dash": style["dash"]}, "name": name,
            "hovertext": [_plain(d.reason) if d else "" for d in sizes],
            "hovertemplate": "block %{x}: size %{y}<br>%{hovertext}<extra></extra>"}


def block_length_figure(run: RunState | list) -> go.Figure:
    """Block size (step line) and tokens committed (accepted + the target's token, markers) per verify step, with
    the controller's decisions written where the size changes. A run that copies from the context has two
    controllers, so each source gets its own size line and markers."""
    state = as_state(run)
    verifies = state.verifies
    bmax = max_block(state)
    sources = list(ev.BLOCK_SOURCES) if _copied(state) else [None]
    data = [_size_series(state, src) for src in sources] + [_committed_series(verifies, src) for src in sources]
    shapes, notes = [], []
    if state.started is not None:  # no run, no max to draw
        shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": bmax, "y1": bmax,
                   "line": {"dash": "dot", "color": GREY, "width": 1}}]
        notes = [{"text": f"max {bmax}", "xref": "paper", "x": 0, "y": bmax, "yanchor": "bottom", "xanchor": "left",
                  "showarrow": False, "font": {"size": 10, "color": GREY}}]
    xmax = max(X_CHUNK, math.ceil(max(len(verifies), 1) / X_CHUNK) * X_CHUNK)
    # the controller's own decisions, not the clip to the tokens left at the end
    notes += [_decision_note(d, side) for d, side in placed(state.size_changes, xmax)]
    if not verifies:
        notes.append(_note("waiting for the first block…"))
    return _figure(data, "Block length per step", _axis("verify step (block)", [0.5, xmax + 0.5]),
                   _axis("tokens", [0, HEADROOM * bmax + 0.5], tickvals=list(range(0, bmax + 1, math.ceil(bmax / 4)))),
                   shapes, notes)


def acceptance_histogram_figure(run: RunState | list) -> go.Figure:
    """Share of verify steps that committed k tokens (accepted drafts + the target's token), τ marked."""
    state = as_state(run)
    s = run_stats(state) if state.n_events else {"acceptance_histogram": {}, "tau": 0.0}
    bmax = max_block(state) if state.n_events else 1
    hist = {int(k): n for k, n in s["acceptance_histogram"].items()}
    total = sum(hist.values())
    ks = list(range(1, bmax + 1))
    data = [_histogram_bars(state, ks, total, src) for src in ev.BLOCK_SOURCES] if _copied(state) else [
        {"type": "bar", "x": ks, "y": [hist.get(k, 0) / total if total else 0.0 for k in ks], "name": "share of steps",
         "marker": {"color": BLUE, "pattern": {"shape": "/"}}, "customdata": [hist.get(k, 0) for k in ks],
         "hovertemplate": "%{x} tokens: %{customdata} steps (%{y:.0%})<extra></extra>"}]
    shapes, notes = [], []
    if total:
        shapes.append({"type": "line", "yref": "paper", "x0": s["tau"], "x1": s["tau"], "y0": 0, "y1": 1,
                       "line": {"color": VERMILLION, "dash": "dash", "width": 2}})
        notes.append({"text": f"τ = {s['tau']:.2f}", "x": s["tau"], "y": 1, "yref": "paper", "xanchor": "left",
                      "yanchor": "top", "showarrow": False, "font": {"size": 11}})
    else:
        notes.append(_note("no verify steps yet"))
    dtick = 1 if bmax <= 16 else 2
    # barmode stack: drafted and copied blocks' shares add up to the run's histogram
    return _figure(data, "Acceptance length (bonus token counted)",
                   _axis("tokens committed per step", [0.4, bmax + 0.6], dtick=dtick),
                   _axis("share of steps", [0, 1.05], tickformat=".0%"), shapes, notes, barmode="stack")


def _histogram_bars(state: RunState, ks: list[int], total: int, source: str) -> dict[str, Any]:
    """One source's verify steps by tokens committed, as shares of all the run's steps (stacked with the other's)."""
    n = [sum(v.accepted_len + 1 == k for v in state.verifies if v.source == source) for k in ks]
    style = SOURCE_STYLE[source]
    return {"type": "bar", "x": ks, "y": [c / total if total else 0.0 for c in n], "name": f"{style['name']} blocks",
            "marker": {"color": style["bar"], "pattern": {"shape": style["pattern"]}}, "customdata": n,
            "hovertemplate": f"%{{x}} tokens: %{{customdata}} {style['name']} blocks (%{{y:.0%}} of steps)<extra></extra>"}


Rates = tuple[list[int], list[float | None], list[float | None], list[int]]


def position_rates(run: RunState | list, source: str = ev.DRAFT) -> Rates:
    """Per proposed position k of the blocks `source` proposed (drafted, or copied from the context): P(accepted |
    all earlier accepted), the share of those blocks accepted through k, and how many blocks reached k."""
    state = as_state(run)
    bmax = max(max_block(state) if state.n_events else 2, 2)
    ks = list(range(1, bmax))
    c = state.position_counts(source)
    cond, uncond, reached_n = [], [], []
    for k in ks:
        proposed, reached, accepted = (x[k - 1] if k <= len(x) else 0 for x in (c.proposed, c.reached, c.accepted))
        cond.append(accepted / reached if reached else None)
        uncond.append(accepted / proposed if proposed else None)
        reached_n.append(reached)
    return ks, cond, uncond, reached_n


MIN_SAMPLES = 5  # a rate from fewer blocks than this is not drawn (its count is still written under the axis)
TICK_LINE_PX = 14  # a second line of tick labels


def _sampled(rates: list[float | None], counts: list[int]) -> list[float | None]:
    return [r if n >= MIN_SAMPLES else None for r, n in zip(rates, counts)]


def per_position_figure(run: RunState | list) -> go.Figure:
    """Acceptance per drafted position (bars: given the position was reached; line: of all drafted blocks). A run
    that copies from the context adds its copied blocks' conditional acceptance as its own series: the draft's
    positions are not mixed with the copy's."""
    state = as_state(run)
    ks, cond, uncond, reached_n = position_rates(state)
    copied = _copied(state)
    who = "drafted blocks" if copied else "all blocks"
    data = [
        {"type": "bar", "x": ks, "y": _sampled(cond, reached_n), "name": "P(accept | reached)" + (", drafted" if copied else ""),
         "customdata": reached_n, "marker": {"color": BLUE, "pattern": {"shape": "x"}},
         "hovertemplate": "position %{x}: %{y:.0%} of %{customdata} reaching it<extra></extra>"},
        {"type": "scatter", "x": ks, "y": uncond, "name": f"accepted through k ({who})", "mode": "lines+markers",
         "line": {"color": ORANGE, "dash": "dash"}, "marker": {"symbol": "square", "size": 6},
         "hovertemplate": f"position %{{x}}: %{{y:.0%}} of {who}<extra></extra>"},
    ]
    if copied:
        _, ccond, _, creached = position_rates(state, ev.COPY)
        data.append({"type": "scatter", "x": ks, "y": _sampled(ccond, creached), "name": "P(accept | reached), copied",
                     "mode": "markers",
                     "customdata": creached, "marker": {"color": GREEN, "symbol": "star", "size": 10},
                     "hovertemplate": "position %{x}: %{y:.0%} of %{customdata} copied blocks reaching it<extra></extra>"})
    notes = []
    if not any(reached_n) and not copied:
        st = state.started
        notes.append(_note("no drafted positions (no draft)" if st is not None and not st.has_draft else "no blocks yet"))
    bmax = ks[-1] + 1
    # Each position's sample count under it (a rate from 2 blocks read as sure as one from 200); every other position
    # past 16, where a count a position would not fit
    shown = ks if len(ks) <= 16 else ks[::2]
    ticks = {"tickvals": shown, "ticktext": [f"{k}<br>n={reached_n[k - 1]}" for k in shown]}
    return _figure(data, "Acceptance by draft position",
                   _axis("draft position (n: blocks reaching it)",
                         [0.4, bmax - 0.4], **ticks),
                   _axis("acceptance", [0, 1.05], tickformat=".0%"), annotations=notes, bottom=TICK_LINE_PX)


def throughput_figure(run: RunState | list, baseline: RunState | list | None = None) -> go.Figure:
    """Cumulative output tokens against wall-clock time: this run (solid) and the no-draft baseline (dashed)."""
    data, notes = [], []
    tmax, nmax = 1.0, 1
    state, base = as_state(run), as_state(baseline) if baseline else None
    series = [("this run", state, BLUE, "solid", "circle")]
    if base is not None:
        series.append(("baseline (no draft)", base, VERMILLION, "dash", "x"))
    for name, evs, color, dash, symbol in series:
        commits = evs.commits
        if not commits:
            continue
        xs = [0.0] + [round(c.t_ms / 1000, 4) for c in commits]
        ys = [0] + [c.n_out for c in commits]
        tps = run_stats(evs)["tokens_per_s"]
        data.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines+markers", "name": f"{name}: {tps:.1f} tok/s",
                     "line": {"shape": "hv", "color": color, "dash": dash, "width": 2}, "marker": {"symbol": symbol, "size": 4},
                     "hovertemplate": "%{x:.2f} s: %{y} tokens<extra>" + name + "</extra>"})
        tmax, nmax = max(tmax, xs[-1]), max(nmax, ys[-1])
    if base is not None and state.n_events:
        run_t, base_t = run_stats(state)["tokens_per_s"], run_stats(base)["tokens_per_s"]
        if base_t > 0:
            notes.append({"text": f"speedup {run_t / base_t:.2f}×", "x": 0.02, "y": 0.98, "xref": "paper", "yref": "paper",
                          "showarrow": False, "xanchor": "left", "yanchor": "top", "font": {"size": 12}})
    if not data:
        notes.append(_note("no tokens yet"))
    return _figure(data, "Throughput: tokens over time", _axis("seconds since the request", [0, _nice(tmax)]),
                   _axis("output tokens", [0, _nice(nmax)]), annotations=notes)


def _nice(x: float) -> float:
    """Round an axis maximum up to 1, 2 or 5 × 10^k so the range changes rarely."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if x <= m * p * (1 + 1e-9):
            return float(m * p)
    return float(10 * p)


def all_figures(run: RunState | list, baseline: RunState | list | None = None) -> dict[str, go.Figure]:
    state = as_state(run)
    return {"block_length": block_length_figure(state), "histogram": acceptance_histogram_figure(state),
            "positions": per_position_figure(state), "throughput": throughput_figure(state, baseline)}
