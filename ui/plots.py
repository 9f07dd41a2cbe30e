"""Pure figure builders: engine events → plotly figures (block length, acceptance histogram, per-position
acceptance, throughput vs the baseline).

Gradio remounts a plotly figure on every update, so the playground redraws these only at block ends and
keeps axis ranges fixed (they grow in whole chunks) so a redraw doesn't jump. `template="none"` keeps the
JSON small. Every series has a second, non-colour encoding (dash style, marker symbol or bar pattern).
Figures are assembled as plain dicts and wrapped without plotly's validation: property-path updates
(`update_layout`, `add_hline`, …) and validation cost ~40 ms per call on a small CPU, too slow for a live view.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from dflash import events as ev
from ui.render import BLUE, GREEN, GREY, ORANGE, VERMILLION, run_stats, started

X_CHUNK = 20  # the x axis grows in steps of this many blocks
GRID = "rgba(128,128,128,0.2)"
# The resolved "none" template (no theme styling): set explicitly so the unvalidated figures below don't get
# plotly's default template (7 KB per figure) attached when serialised.
NONE_TEMPLATE = go.Figure(layout={"template": "none"}).layout.template.to_plotly_json()


def _axis(title: str, rng: list[float], **kw: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "range": rng, "autorange": False, "showgrid": True, "gridcolor": GRID,
            "zeroline": False, **kw}


def _figure(data: list[dict], title: str, xaxis: dict, yaxis: dict, shapes: list | None = None,
            annotations: list | None = None, height: int = 270) -> go.Figure:
    layout = {"template": NONE_TEMPLATE, "title": {"text": title, "font": {"size": 14}, "x": 0.01}, "height": height,
              "margin": {"l": 52, "r": 12, "t": 36, "b": 44}, "xaxis": xaxis, "yaxis": yaxis,
              "legend": {"orientation": "h", "y": -0.3, "x": 0}, "hovermode": "closest", "font": {"size": 11},
              "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)", "transition": {"duration": 0},
              "shapes": shapes or [], "annotations": annotations or []}
    # Unvalidated for speed (tests validate every figure with go.Figure(fig.to_dict())).
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def _note(text: str) -> dict[str, Any]:
    return {"text": text, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False, "font": {"color": GREY}}


def max_block(events: list) -> int:
    """Largest block size the run could use (for fixed axis ranges)."""
    st = started(events)
    sizes = [e.size for e in events if isinstance(e, ev.BlockSize)]
    cfg = 1
    if st is not None and st.has_draft:
        cfg = st.request.get("max_block_size") or st.request.get("block_size") or st.trained_block_size or 1
    return max([cfg, 1, *sizes])


def _short(reason: str, limit: int = 28) -> str:
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def block_length_figure(events: list) -> go.Figure:
    """Drafted block size (step line) and tokens committed (accepted + the target's token, markers) per verify
    step, with the controller's decisions written where the size changes."""
    verifies = [e for e in events if isinstance(e, ev.Verify)]
    decisions = {e.block: e for e in events if isinstance(e, ev.BlockSize)}
    bmax = max_block(events)
    xs = [v.block for v in verifies]
    data = [
        {"type": "scatter", "x": xs, "y": [v.block_size for v in verifies], "mode": "lines", "line": {"shape": "hv",
         "color": BLUE, "width": 2, "dash": "solid"}, "name": "block size drafted",
         "hovertext": [decisions[v.block].reason if v.block in decisions else "" for v in verifies],
         "hovertemplate": "block %{x}: size %{y}<br>%{hovertext}<extra></extra>"},
        {"type": "scatter", "x": xs, "y": [v.accepted_len + 1 for v in verifies], "mode": "markers",
         "name": "tokens committed (accepted + 1)",
         "marker": {"color": VERMILLION, "symbol": "diamond", "size": 7, "line": {"width": 1, "color": "#ffffff"}},
         "hovertemplate": "block %{x}: %{y} tokens committed<extra></extra>"},
    ]
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": bmax, "y1": bmax,
               "line": {"dash": "dot", "color": GREY, "width": 1}}]
    notes = [{"text": f"max {bmax}", "xref": "paper", "x": 0, "y": bmax, "yanchor": "bottom", "xanchor": "left",
              "showarrow": False, "font": {"size": 10, "color": GREY}}]
    prev = None
    for v in verifies:
        d = decisions.get(v.block)
        # Annotate the controller's own decisions, not the clip to the tokens left at the end.
        if d is not None and prev is not None and d.size != prev and "clipped" not in d.reason and len(notes) < 13:
            notes.append({"x": v.block, "y": d.size, "text": _short(d.reason), "showarrow": True, "arrowhead": 2, "ax": 0,
                          "ay": -22, "font": {"size": 9, "color": GREY}, "arrowcolor": GREY})
        prev = d.size if d is not None else prev
    if not verifies:
        notes.append(_note("waiting for the first block…"))
    xmax = max(X_CHUNK, math.ceil(max(len(verifies), 1) / X_CHUNK) * X_CHUNK)
    return _figure(data, "Block length per step", _axis("verify step (block)", [0.5, xmax + 0.5]),
                   _axis("tokens", [0, bmax + 1.5]), shapes, notes)


def acceptance_histogram_figure(events: list) -> go.Figure:
    """Share of verify steps that committed k tokens (accepted drafts + the target's token), τ marked."""
    s = run_stats(events) if events else {"acceptance_histogram": {}, "tau": 0.0}
    bmax = max_block(events) if events else 1
    hist = {int(k): n for k, n in s["acceptance_histogram"].items()}
    total = sum(hist.values())
    ks = list(range(1, bmax + 1))
    data = [{"type": "bar", "x": ks, "y": [hist.get(k, 0) / total if total else 0.0 for k in ks], "name": "share of steps",
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
    return _figure(data, "Acceptance length (bonus token counted)",
                   _axis("tokens committed per step", [0.4, bmax + 0.6], dtick=dtick),
                   _axis("share of steps", [0, 1.05], tickformat=".0%"), shapes, notes)


def position_rates(events: list) -> tuple[list[int], list[float | None], list[float | None], list[int]]:
    """Per draft position k: P(accepted | all earlier accepted), the share of drafted blocks accepted through k,
    and how many blocks reached k."""
    verifies = [e for e in events if isinstance(e, ev.Verify) and e.draft_tokens]
    bmax = max(max_block(events) if events else 2, 2)
    ks = list(range(1, bmax))
    cond, uncond, reached_n = [], [], []
    for k in ks:
        drafted = [v for v in verifies if len(v.draft_tokens) >= k]
        reached = [v for v in drafted if v.accepted_len >= k - 1]
        cond.append(sum(v.accepted_len >= k for v in reached) / len(reached) if reached else None)
        uncond.append(sum(v.accepted_len >= k for v in drafted) / len(drafted) if drafted else None)
        reached_n.append(len(reached))
    return ks, cond, uncond, reached_n


def per_position_figure(events: list) -> go.Figure:
    ks, cond, uncond, reached_n = position_rates(events)
    data = [
        {"type": "bar", "x": ks, "y": cond, "name": "P(accept | reached)", "customdata": reached_n,
         "marker": {"color": GREEN, "pattern": {"shape": "x"}},
         "hovertemplate": "position %{x}: %{y:.0%} of %{customdata} reaching it<extra></extra>"},
        {"type": "scatter", "x": ks, "y": uncond, "name": "accepted through k (all blocks)", "mode": "lines+markers",
         "line": {"color": ORANGE, "dash": "dash"}, "marker": {"symbol": "square", "size": 6},
         "hovertemplate": "position %{x}: %{y:.0%} of drafted blocks<extra></extra>"},
    ]
    notes = []
    if not any(n for n in reached_n):
        st = started(events)
        notes.append(_note("no drafted positions (no draft)" if st is not None and not st.has_draft else "no blocks yet"))
    bmax = ks[-1] + 1
    return _figure(data, "Acceptance by draft position",
                   _axis("draft position in the block", [0.4, bmax - 0.4], dtick=1 if bmax <= 16 else 2),
                   _axis("acceptance", [0, 1.05], tickformat=".0%"), annotations=notes)


def throughput_figure(events: list, baseline: list | None = None) -> go.Figure:
    """Cumulative output tokens against wall-clock time: this run (solid) and the no-draft baseline (dashed)."""
    data, notes = [], []
    tmax, nmax = 1.0, 1
    series = [("this run", events, BLUE, "solid", "circle")]
    if baseline:
        series.append(("baseline (no draft)", baseline, VERMILLION, "dash", "x"))
    for name, evs, color, dash, symbol in series:
        commits = [e for e in evs if isinstance(e, ev.Commit)]
        if not commits:
            continue
        xs = [0.0] + [round(c.t_ms / 1000, 4) for c in commits]
        ys = [0] + [c.n_out for c in commits]
        tps = run_stats(evs)["tokens_per_s"]
        data.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines+markers", "name": f"{name}: {tps:.1f} tok/s",
                     "line": {"shape": "hv", "color": color, "dash": dash, "width": 2}, "marker": {"symbol": symbol, "size": 4},
                     "hovertemplate": "%{x:.2f} s: %{y} tokens<extra>" + name + "</extra>"})
        tmax, nmax = max(tmax, xs[-1]), max(nmax, ys[-1])
    if baseline and events:
        run_t, base_t = run_stats(events)["tokens_per_s"], run_stats(baseline)["tokens_per_s"]
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


def all_figures(events: list, baseline: list | None = None) -> dict[str, go.Figure]:
    return {"block_length": block_length_figure(events), "histogram": acceptance_histogram_figure(events),
            "positions": per_position_figure(events), "throughput": throughput_figure(events, baseline)}
