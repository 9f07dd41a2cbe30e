"""ui/live.py on event streams recorded from real engine runs: when a streaming run redraws (block ends, denoising
passes only when watched, at most every refresh_s; charts only at block ends, at most every plot_refresh_s), and
the status lines."""

from __future__ import annotations

import pytest

from dflash.decode import events as ev
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
    assert live_status(events[:1]) == f"Generating: reading the prompt ({len(events[0].prompt_ids)} tokens)…"
    first = next(i for i, e in enumerate(events) if isinstance(e, ev.Commit))
    part = events[: first + 1]
    n_verify = sum(isinstance(e, ev.Verify) for e in part)
    counts = f"{render.count(part[-1].n_out, 'token')}, {render.count(n_verify, 'verify step')}"
    assert live_status(part, "Recording") == f"Recording: {counts}…"
    s = render.run_stats(events)
    line = final_status(events)
    assert line.startswith(f"**{render.finish_words(render.finished(events))}** {s['n_output_tokens']} tokens in ")
    assert f"τ {s['tau']:.2f}" in line


def test_the_hardware_line_shows_the_host_settings_and_ends_with_the_dtype():
    import torch

    from dflash.loading.host import HostSettings
    from tests.ui_support import tiny_text_engine
    from ui.live import dtype_of, hardware

    engine = tiny_text_engine(block_size=4)
    assert hardware(engine).endswith("· float32 (exact)") and dtype_of(hardware(engine)) == "float32"
    rows = [{"dtype": "float32", "threads": 2, "layout": "transposed", "step_ms": 40.2, "verify_ms": 65.4, "score_ms": 105.6}]
    engine.host = HostSettings("float32", 2, "transposed", "cache", block=8, candidates=rows)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        line = hardware(engine)
    finally:
        torch.set_num_threads(before)
    assert "CPU, 1 thread, transposed layout; 1-token step 40 ms, 8-token verify 65 ms " \
           "(probe cached)" in line and dtype_of(line) == "float32"
    engine.host = HostSettings("bfloat16", 2, "linear", "cache", block=8, float32_from_rows=16,
                               candidates=[{**rows[0], "dtype": "bfloat16", "layout": "linear"}])
    assert ", linear layout, prompts in float32 matmuls; 1-token step 40 ms" in hardware(engine)
    assert dtype_of("model · CPU · bfloat16 (fast: identical except at numerical ties)") == "bfloat16"
    assert dtype_of("") == ""


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_costly_frame_stretches_the_wait_before_the_next_one(runs):
    commits = [e for e in runs["mixed"] if isinstance(e, ev.Commit)]
    clock = Clock()
    throttle = FrameThrottle(0.1, 0.0, max_share=0.1, clock=clock)
    assert throttle.due(commits[0]) == (True, True)
    throttle.drawn(0.05)  # 50 ms a frame: at most one every 0.5 s keeps drawing at a tenth of the run
    clock.now = 0.3
    assert throttle.due(commits[1]) == (False, False)
    clock.now = 0.51
    assert throttle.due(commits[2]) == (True, True)
    throttle.drawn(0.001)  # a cheap frame: refresh_s rules again
    clock.now = 0.65
    assert throttle.due(commits[3]) == (True, True)


def test_frames_are_timed_from_building_until_the_consumer_asks_again(runs):
    events = runs["mixed"]
    clock = Clock()
    throttle = FrameThrottle(0.0, 0.0, max_share=0.5, clock=clock)

    def engine():  # each event takes the engine 50 ms
        for e in events:
            clock.now += 0.05
            yield e

    def draw(seen: list, charts: bool) -> float:
        start = clock.now
        clock.now += 0.2  # building the frame
        return start

    seen: list = []
    starts = []
    for start in throttle.frames(engine(), seen, draw):
        starts.append(start)
        clock.now += 0.1  # the consumer sends it: the frame cost 0.3 s, so the next waits 0.6 s from its start
    assert seen == events
    assert len(starts) >= 2
    assert all(b - a >= 0.6 - 1e-9 for a, b in zip(starts, starts[1:]))
    assert min(b - a for a, b in zip(starts, starts[1:])) < 0.6 + 0.05 * 8  # drawn again once due, not later


def test_a_one_token_run_shows_no_undefined_rate():
    """One token comes from the prompt's own forward: no verify step (τ undefined) and no token after the first (no
    decode speed). The status line and the statistics say "1 token" and show neither rate as 0."""
    from dflash.decode.request import Request
    from tests.ui_support import PROMPT, tiny_text_engine
    from ui.render_stats import stats_html

    events = list(tiny_text_engine().stream(Request(prompt=PROMPT, max_new_tokens=1)))
    line = final_status(events)
    assert "** 1 token in " in line and "τ" not in line and "tok/s" not in line, line
    html = stats_html(events)
    # τ, tokens / s and draft / verify time: none of them shown as 0
    assert '<div class="v">0.0' not in html and html.count('<div class="v">–</div>') == 3, html
    two = list(tiny_text_engine().stream(Request(prompt=PROMPT, max_new_tokens=2)))
    assert "** 2 tokens in " in final_status(two) and "τ " in final_status(two) and "tok/s" in final_status(two)
