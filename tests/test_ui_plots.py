"""ui/plots.py on event streams recorded from real engine runs: figure data equals what the events say, axes stay
fixed while a run grows, every series has a non-colour encoding, and every figure is valid plotly."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from dflash.decode import events as ev
from tests.ui_support import recorded_runs
from ui import plots


@pytest.fixture(scope="module")
def runs():
    return recorded_runs()


def verifies(events):
    return [e for e in events if isinstance(e, ev.Verify)]


def valid(fig: go.Figure) -> go.Figure:
    """Re-build with plotly's validation on (the app skips it for speed)."""
    return go.Figure(json.loads(fig.to_json()))


def test_block_length_curve_follows_the_controller(runs):
    events = runs["mixed"]
    fig = valid(plots.block_length_figure(events))
    size, committed = fig.data
    vs = verifies(events)
    assert list(size.x) == [v.block for v in vs] and list(size.y) == [v.block_size for v in vs]
    assert size.line.shape == "hv" and list(committed.y) == [v.accepted_len + 1 for v in vs]
    assert committed.marker.symbol == "diamond"  # second encoding besides colour
    # Slow-start changed the size: each change is annotated with the controller's reason.
    reasons = {e.block: e.reason for e in events if isinstance(e, ev.BlockSize)}
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    changes = [v for prev, v in zip(vs, vs[1:]) if v.block_size != prev.block_size and "clipped" not in reasons[v.block]]
    xmax = fig.layout.xaxis.range[1] - 0.5  # the axis: [0.5, xmax + 0.5]
    # Written whole (wrapped at NOTE_CHARS), in block order, each where its label clears the last written one on the
    # narrowest chart; up and to the right of its point (to the left where the axis ends first).
    assert arrows and [a.text.replace("<br>", " ") for a in arrows] == [
        reasons[v.block] for v in changes if v.block in {a.x for a in arrows}]
    assert arrows[0].x == changes[0].block  # the controller's first decision is always written
    extents = []
    for a in arrows:
        assert all(len(line) <= plots.NOTE_CHARS for line in a.text.split("<br>")) and "…" not in a.text
        at, width = (a.x - 0.5) / xmax, plots._note_width(next(e for e in events if getattr(e, "block", None) == a.x
                                                                  and isinstance(e, ev.BlockSize)))
        assert (a.xanchor, a.ax > 0) == (("left", True) if at + width <= 1 else ("right", False)) and a.ay < 0
        extents.append((at, at + width) if a.xanchor == "left" else (at - width, at))
    assert all(lo2 >= hi1 for (_, hi1), (lo2, _) in zip(extents, extents[1:]))
    # …with room above the curve for three lines, ticks up to the max block size only.
    assert fig.layout.yaxis.range[1] == plots.HEADROOM * 8 + 0.5 and max(fig.layout.yaxis.tickvals) == 8
    assert list(size.hovertext) == [reasons[v.block] for v in vs]
    assert fig.layout.shapes[0].y0 == 8  # max block size line


def test_axes_grow_in_chunks_so_redraws_dont_jump(runs):
    events = runs["mixed"]
    idx = [i for i, e in enumerate(events) if isinstance(e, ev.Commit)]
    ranges = {tuple(plots.block_length_figure(events[: i + 1]).layout.xaxis.range) for i in idx[:15]}
    assert ranges == {(0.5, 20.5)}
    yr = {tuple(plots.block_length_figure(events[: i + 1]).layout.yaxis.range) for i in idx}
    assert len(yr) == 1


def test_histogram_is_the_engine_histogram_normalised_with_tau_marked(runs):
    events = runs["mixed"]
    s = events[-1].stats
    fig = valid(plots.acceptance_histogram_figure(events))
    bar = fig.data[0]
    assert list(bar.x) == list(range(1, 9))
    total = sum(s["acceptance_histogram"].values())
    assert list(bar.y) == pytest.approx([s["acceptance_histogram"].get(str(k), 0) / total for k in range(1, 9)])
    assert sum(bar.y) == pytest.approx(1.0) and bar.marker.pattern.shape == "/"
    assert fig.layout.shapes[0].x0 == pytest.approx(s["tau"])
    assert f"τ = {s['tau']:.2f}" in [a.text for a in fig.layout.annotations]


def test_per_position_acceptance_is_conditional_on_reaching_the_position(runs):
    events = runs["mixed"]
    fig = valid(plots.per_position_figure(events))
    bars, line = fig.data
    vs = [v for v in verifies(events) if v.draft_tokens]
    counts = []
    for k, y in zip(bars.x, bars.y):
        reached = [v for v in vs if len(v.draft_tokens) >= k and v.accepted_len >= k - 1]
        counts.append(len(reached))
        if len(reached) >= plots.MIN_SAMPLES:
            assert y == pytest.approx(sum(v.accepted_len >= k for v in reached) / len(reached))
        else:  # a rate from fewer blocks is not drawn (a 100% bar from 1 block read as sure as from 100)
            assert y is None
    # Every position's count is written under it.
    assert list(fig.layout.xaxis.ticktext) == [f"{k}<br>n={n}" for k, n in zip(bars.x, counts)]
    lossy = valid(plots.per_position_figure(runs["lossy"]))  # one block reached position 2: a 0% or 100% bar before
    assert lossy.layout.xaxis.ticktext[1] == "2<br>n=1" and lossy.data[0].y[1] is None
    # The unconditional line equals the engine's per-position statistic.
    per_pos = events[-1].stats["per_position_acceptance"]
    assert list(line.y)[: len(per_pos)] == pytest.approx(per_pos)
    assert line.line.dash == "dash" and bars.marker.pattern.shape == "x"


def test_no_draft_runs_say_so_in_the_position_chart(runs):
    fig = plots.per_position_figure(runs["baseline"])
    assert any("no draft" in a.text for a in fig.layout.annotations)


def test_throughput_against_the_baseline(runs):
    fig = valid(plots.throughput_figure(runs["mixed"], runs["baseline"]))
    run, base = fig.data
    assert run.y[-1] == 40 and base.y[-1] == 40
    assert run.line.dash == "solid" and base.line.dash == "dash"
    commits = [e for e in runs["mixed"] if isinstance(e, ev.Commit)]
    assert list(run.x)[1:] == pytest.approx([c.t_ms / 1000 for c in commits], abs=1e-4)
    sp = runs["mixed"][-1].stats["tokens_per_s"] / runs["baseline"][-1].stats["tokens_per_s"]
    assert f"speedup {sp:.2f}×" in [a.text for a in fig.layout.annotations]
    assert fig.layout.xaxis.range[1] >= max(run.x[-1], base.x[-1])
    assert len(plots.throughput_figure(runs["mixed"]).data) == 1


def test_empty_figures_explain_themselves_and_stay_small(runs):
    for name, fig in plots.all_figures([]).items():
        assert fig.layout.annotations, name
        valid(fig)
    for name, fig in plots.all_figures(runs["mixed"], runs["baseline"]).items():
        valid(fig)
        assert len(fig.to_json()) < 12_000, name  # no default template shipped on every redraw
        assert fig.layout.xaxis.autorange is False and fig.layout.yaxis.autorange is False


def test_nice_axis_maxima():
    assert [plots._nice(x) for x in (0, 0.3, 1, 1.1, 2.5, 7, 40, 120)] == [1.0, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 200.0]


def test_a_run_that_copies_splits_every_acceptance_view_by_source(runs):
    """With copying from the context on, copied blocks get their own series: committed markers, histogram bars
    (stacked: together they are the run's histogram) and per-position acceptance; the draft's bars count drafted
    blocks only."""
    events = runs["copy"]
    vs = verifies(events)
    by = {src: [v for v in vs if v.source == src] for src in ev.BLOCK_SOURCES}
    assert by[ev.DRAFT] and by[ev.COPY]  # the recorded run has both
    fig = valid(plots.block_length_figure(events))
    size_d, size_c, drafted, copied = fig.data
    for series, size, src in ((drafted, size_d, ev.DRAFT), (copied, size_c, ev.COPY)):
        assert list(series.x) == list(size.x) == [v.block for v in by[src]]
        assert list(series.y) == [v.accepted_len + 1 for v in by[src]] and list(size.y) == [v.block_size for v in by[src]]
    assert drafted.marker.symbol != copied.marker.symbol and "copied" in copied.name
    assert size_d.line.dash != size_c.line.dash and "copied" in size_c.name
    # Four long legend entries wrap: the legend hangs below the axis title and the figure grows by as much as the
    # bottom margin, so the plot area keeps the height of a figure without a legend.
    lay, bare = fig.layout, plots.acceptance_histogram_figure(runs["mixed"]).layout
    assert lay.legend.yanchor == "top" and lay.legend.y < 0 and lay.height > bare.height
    assert lay.height - lay.margin.t - lay.margin.b == bare.height - bare.margin.t - bare.margin.b
    # Each controller's decisions are written against its own previous block, never at a switch of source alone.
    sizes = {e.block: e for e in events if isinstance(e, ev.BlockSize)}
    changes = [b for src in ev.BLOCK_SOURCES for a, b in zip(by[src], by[src][1:])
               if a.block_size != b.block_size and "clipped" not in sizes[b.block].reason]
    written = plots.placed(sorted((sizes[v.block] for v in changes), key=lambda d: d.block),
                           fig.layout.xaxis.range[1] - 0.5)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert [a.text.replace("<br>", " ") for a in arrows] == [plots.decision(d) for d, _ in written]
    assert all(not a.text.startswith("copy from the context") for a in arrows)

    fig = valid(plots.acceptance_histogram_figure(events))
    assert fig.layout.barmode == "stack" and [b.marker.pattern.shape for b in fig.data] == ["/", "."]
    total = sum(events[-1].stats["acceptance_histogram"].values())
    for k, *shares in zip(fig.data[0].x, fig.data[0].y, fig.data[1].y):
        assert sum(shares) == pytest.approx(events[-1].stats["acceptance_histogram"].get(str(k), 0) / total)
    assert list(fig.data[1].customdata) == [sum(v.accepted_len + 1 == k for v in by[ev.COPY]) for k in fig.data[1].x]

    bars, line, copy_marks = valid(plots.per_position_figure(events)).data
    for series, src in ((bars, ev.DRAFT), (copy_marks, ev.COPY)):
        for k, y in zip(series.x, series.y):
            reached = [v for v in by[src] if len(v.draft_tokens) >= k and v.accepted_len >= k - 1]
            rate = sum(v.accepted_len >= k for v in reached) / len(reached) if reached else None
            assert y == (pytest.approx(rate) if len(reached) >= plots.MIN_SAMPLES else None)
    for k, y in zip(line.x, line.y):
        blocks = [v for v in by[ev.DRAFT] if len(v.draft_tokens) >= k]
        assert y == (pytest.approx(sum(v.accepted_len >= k for v in blocks) / len(blocks)) if blocks else None)
    assert "drafted" in line.name and copy_marks.marker.symbol == "star"


def test_a_run_without_copies_keeps_one_series_per_view(runs):
    assert len(plots.block_length_figure(runs["mixed"]).data) == 2
    assert len(plots.acceptance_histogram_figure(runs["mixed"]).data) == 1
    assert len(plots.per_position_figure(runs["mixed"]).data) == 2


def test_the_empty_block_length_chart_draws_no_max_line():
    """Before any run there is no max block size to mark (the chart said "max 1")."""
    fig = plots.block_length_figure([])
    assert not fig.layout.shapes and not [a for a in fig.layout.annotations if a.text.startswith("max")]
    run = plots.block_length_figure(recorded_runs()["mixed"])
    assert [a.text for a in run.layout.annotations if a.text.startswith("max")] == ["max 8"]
