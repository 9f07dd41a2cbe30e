"""Pure figure builders: engine events → plotly figures (block length, acceptance histogram, per-position
acceptance, throughput vs the baseline).

Gradio remounts a plotly figure on every update, so the playground redraws these only at block ends and
keeps axis ranges fixed (they grow in whole chunks) so a redraw doesn't jump. `template="none"` keeps the
JSON small. Every series has a second, non-colour encoding (dash style, marker symbol or bar pattern).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from dflash import events as ev
from ui.render import BLUE, GREEN, GREY, ORANGE, VERMILLION, finished, run_stats, started

X_CHUNK = 20  # the x axis grows in steps of this many blocks

PLOT_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str, height: int = 260) -> go.Figure:
    fig.update_layout(template="none", title={"text": title, "font": {"size": 14}, "x": 0.01}, height=height,
                      margin={"l": 48, "r": 12, "t": 36, "b": 40}, xaxis_title=xtitle, yaxis_title=ytitle,
                      legend={"orientation": "h", "y": -0.28, "x": 0}, hovermode="closest",
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", transition={"duration": 0},
                      font={"size": 11})
    fig.update_xaxes(showgrid=True, gridcolor="rgba(128,128,128,0.2)", zeroline=False, autorange=False)
    fig.update_yaxes(showgrid=True, gridcolor="rgba(128,128,128,0.2)", zeroline=False, autorange=False)
    return fig


def max_block(events: list) -> int:
    """Largest block size the run could use (for fixed axis ranges)."""
    st = started(events)
    sizes = [e.size for e in events if isinstance(e, ev.BlockSize)]
    cfg = 1
    if st is not None and st.has_draft:
        cfg = st.request.get("max_block_size") or st.request.get("block_size") or st.trained_block_size or 1
    return max([cfg, 1, *sizes])


def _empty(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"color": GREY})
    return fig


def block_length_figure(events: list) -> go.Figure:
    """Drafted block size (step line) and accepted length incl. the target's token (markers) per verify step,
    with the controller's decisions annotated where the size changes."""
    verifies = [e for e in events if isinstance(e, ev.Verify)]
    decisions = {e.block: e for e in events if isinstance(e, ev.BlockSize)}
    bmax = max_block(events)
    fig = go.Figure()
    n = len(verifies)
    xs = [v.block for v in verifies]
    fig.add_trace(go.Scatter(x=xs, y=[v.block_size for v in verifies], mode="lines", line_shape="hv", name="block size drafted",
                             line={"color": BLUE, "width": 2, "dash": "solid"},
                             hovertext=[decisions[v.block].reason if v.block in decisions else "" for v in verifies],
                             hovertemplate="block %{x}: size %{y}<br>%{hovertext}<extra></extra>"))
    fig.add_trace(go.Scatter(x=xs, y=[v.accepted_len + 1 for v in verifies], mode="markers", name="tokens committed (accepted + 1)",
                             marker={"color": VERMILLION, "symbol": "diamond", "size": 7, "line": {"width": 1, "color": "#fff"}},
                             hovertemplate="block %{x}: %{y} tokens committed<extra></extra>"))
    fig.add_hline(y=bmax, line={"dash": "dot", "color": GREY, "width": 1}, annotation_text=f"max {bmax}",
                  annotation_position="top left", annotation_font_size=10)
    prev = None
    shown = 0
    for v in verifies:
        d = decisions.get(v.block)
        if d is not None and prev is not None and d.size != prev and shown < 12:
            fig.add_annotation(x=v.block, y=d.size, text=_short(d.reason), showarrow=True, arrowhead=2, ax=0, ay=-22,
                               font={"size": 9, "color": GREY}, arrowcolor=GREY)
            shown += 1
        prev = d.size if d is not None else prev
    xmax = max(X_CHUNK, math.ceil(max(n, 1) / X_CHUNK) * X_CHUNK)
    fig.update_xaxes(range=[0.5, xmax + 0.5])
    fig.update_yaxes(range=[0, bmax + 1.5])
    if not verifies:
        _empty(fig, "waiting for the first block…")
    return _layout(fig, "Block length per step", "verify step (block)", "tokens")


def _short(reason: str, limit: int = 28) -> str:
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def acceptance_histogram_figure(events: list) -> go.Figure:
    """Share of verify steps that committed k tokens (k = accepted drafts + the target's token), with τ marked."""
    s = run_stats(events) if events else {"acceptance_histogram": {}, "tau": 0.0, "n_verify": 0}
    bmax = max_block(events) if events else 1
    hist = {int(k): n for k, n in s["acceptance_histogram"].items()}
    total = sum(hist.values())
    ks = list(range(1, bmax + 1))
    ys = [hist.get(k, 0) / total if total else 0.0 for k in ks]
    fig = go.Figure(go.Bar(x=ks, y=ys, name="share of steps", marker={"color": BLUE, "pattern": {"shape": "/"}},
                           customdata=[hist.get(k, 0) for k in ks],
                           hovertemplate="%{x} tokens: %{customdata} steps (%{y:.0%})<extra></extra>"))
    if total:
        fig.add_vline(x=s["tau"], line={"color": VERMILLION, "dash": "dash", "width": 2},
                      annotation_text=f"τ = {s['tau']:.2f}", annotation_position="top right", annotation_font_size=11)
    fig.update_xaxes(range=[0.4, bmax + 0.6], dtick=1 if bmax <= 16 else 2)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    if not total:
        _empty(fig, "no verify steps yet")
    return _layout(fig, "Acceptance length (bonus token counted)", "tokens committed per step", "share of steps")


def per_position_figure(events: list) -> go.Figure:
    """Per draft position k: P(accepted | reached k) (bars) and the share of blocks accepted through k (line)."""
    verifies = [e for e in events if isinstance(e, ev.Verify) and e.draft_tokens]
    bmax = max(max_block(events) if events else 2, 2)
    ks = list(range(1, bmax))
    cond, uncond, reached_n = [], [], []
    for k in ks:
        drafted = [v for v in verifies if len(v.draft_tokens) >= k]
        reached = [v for v in drafted if v.accepted_len >= k - 1]  # all earlier positions accepted
        cond.append(sum(v.accepted_len >= k for v in reached) / len(reached) if reached else None)
        uncond.append(sum(v.accepted_len >= k for v in drafted) / len(drafted) if drafted else None)
        reached_n.append(len(reached))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=ks, y=cond, name="P(accept | reached)", customdata=reached_n,
                         marker={"color": GREEN, "pattern": {"shape": "x"}},
                         hovertemplate="position %{x}: %{y:.0%} of %{customdata} reaching it<extra></extra>"))
    fig.add_trace(go.Scatter(x=ks, y=uncond, name="accepted through k (all blocks)", mode="lines+markers",
                             line={"color": ORANGE, "dash": "dash"}, marker={"symbol": "square", "size": 6},
                             hovertemplate="position %{x}: %{y:.0%} of drafted blocks<extra></extra>"))
    fig.update_xaxes(range=[0.4, bmax - 0.4], dtick=1 if bmax <= 16 else 2)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    if not verifies:
        _empty(fig, "no drafted positions" if started(events) is not None and not started(events).has_draft else "no blocks yet")
    return _layout(fig, "Acceptance by draft position", "draft position in the block", "acceptance")


def throughput_figure(events: list, baseline: list | None = None) -> go.Figure:
    """Cumulative output tokens against wall-clock time: this run (solid) and the no-draft baseline (dashed)."""
    fig = go.Figure()
    tmax, nmax = 1.0, 1
    series = [("this run", events, BLUE, "solid", "circle")]
    if baseline:
        series.append(("baseline (no draft)", baseline, VERMILLION, "dash", "x"))
    for name, evs, color, dash, symbol in series:
        commits = [e for e in evs if isinstance(e, ev.Commit)]
        if not commits:
            continue
        xs = [0.0] + [c.t_ms / 1000 for c in commits]
        ys = [0] + [c.n_out for c in commits]
        tps = run_stats(evs)["tokens_per_s"]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line_shape="hv", name=f"{name}: {tps:.1f} tok/s",
                                 line={"color": color, "dash": dash, "width": 2}, marker={"symbol": symbol, "size": 4},
                                 hovertemplate="%{x:.2f} s: %{y} tokens<extra>" + name + "</extra>"))
        tmax, nmax = max(tmax, xs[-1]), max(nmax, ys[-1])
    if baseline and events:
        run_t, base_t = run_stats(events)["tokens_per_s"], run_stats(baseline)["tokens_per_s"]
        if base_t > 0:
            fig.add_annotation(text=f"speedup {run_t / base_t:.2f}×", x=0.02, y=0.98, xref="paper", yref="paper",
                               showarrow=False, xanchor="left", yanchor="top", font={"size": 12})
    fig.update_xaxes(range=[0, _nice(tmax)])
    fig.update_yaxes(range=[0, _nice(nmax)])
    if not fig.data:
        _empty(fig, "no tokens yet")
    return _layout(fig, "Throughput: tokens over time", "seconds since the request", "output tokens")


def _nice(x: float) -> float:
    """Round an axis maximum up to 1, 2 or 5 × 10^k so the range changes rarely."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if x <= m * p:
            return float(m * p)
    return float(10 * p)


def all_figures(events: list, baseline: list | None = None) -> dict[str, go.Figure]:
    return {"block_length": block_length_figure(events), "histogram": acceptance_histogram_figure(events),
            "positions": per_position_figure(events), "throughput": throughput_figure(events, baseline)}


__all__ = ["PLOT_CONFIG", "acceptance_histogram_figure", "all_figures", "block_length_figure", "finished",
           "per_position_figure", "throughput_figure"]
