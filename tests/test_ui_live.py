"""ui/live.py on event streams recorded from real engine runs: when a streaming run redraws (block ends, denoising
passes only when watched, at most every refresh_s; charts only at block ends, at most every plot_refresh_s), and
the status lines."""

from __future__ import annotations

import pytest

from dflash import events as ev
from tests.ui_support import recorded_runs
from ui import render
from ui.live import FrameThrottle, final_status, live_status


@pytest.fixture(scope="module")
def runs():
    return recorded_runs()


def decisions(throttle: FrameThrottle, events: list) -> list[tuple[type, bool, bool]]:
    return [(type(e), *throttle.due(e)) for e in events]


def test_unthrottled_runs_redraw_at_every_commit_and_only_there(runs):
    for name in ("mixed", "denoise"):
        got = decisions(FrameThrottle(0.0, 0.0), runs[name])
        assert [(t, r, c) for t, r, c in got if r] == [(ev.Commit, True, True)] * sum(t is ev.Commit for t, _, _ in got)
        assert all(not r and not c for t, r, c in got if t is not ev.Commit), name


def test_watched_denoising_passes_redraw_without_the_charts(runs):
    events = runs["denoise"]  # 3 denoising passes per block
    got = decisions(FrameThrottle(0.0, 0.0, watch_steps=True), events)
    steps = [(r, c) for t, r, c in got if t is ev.DraftStep]
    assert steps and steps == [(True, False)] * len(steps)
    assert all(r and c for t, r, c in got if t is ev.Commit)


def test_refresh_intervals_hold_back_redraws_and_charts(runs):
    commits = [e for e in runs["mixed"] if isinstance(e, ev.Commit)]
    assert len(commits) >= 3
    slow = FrameThrottle(3600.0, 0.0)  # one redraw an hour: the first commit only
    assert [slow.due(e) for e in commits] == [(True, True)] + [(False, False)] * (len(commits) - 1)
    charts = FrameThrottle(0.0, 3600.0)  # every commit redrawn, the charts only the first time
    assert [charts.due(e) for e in commits] == [(True, True)] + [(True, False)] * (len(commits) - 1)


def test_status_lines_follow_the_run(runs):
    events = runs["mixed"]
    assert live_status(events[:1]) == "Generating: reading the prompt…"
    first = next(i for i, e in enumerate(events) if isinstance(e, ev.Commit))
    part = events[: first + 1]
    n_verify = sum(isinstance(e, ev.Verify) for e in part)
    assert live_status(part, "Recording") == f"Recording: {part[-1].n_out} tokens, {n_verify} verify steps…"
    s = render.run_stats(events)
    line = final_status(events)
    assert line.startswith(f"**{render.finish_words(render.finished(events))}** {s['n_output_tokens']} tokens in ")
    assert f"τ {s['tau']:.2f}" in line
