"""The race: DFlash and plain decoding side by side, each pane showing what its run had written at the same moment.

On a CPU the two runs are measured one after the other (run side by side they would share the cores and slow each
other), then played back together at their measured timings: a pane at playback time t shows the tokens its run had
committed t ms after its request started. A running tokens/s uses the statistics' definition (tokens after the
first over the time since the first), so each pane ends on exactly the figure its run shows everywhere else."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from dflash.decode import events as ev
from .render import attr, count, run_stats, show_text

LABEL = ("Measured one after the other on this machine (so the two runs did not share its cores), then played back "
         "together at the measured timings.")


def _commits(events: list) -> list[ev.Commit]:
    return [e for e in events if isinstance(e, ev.Commit)]


def end_ms(events: list) -> float:
    """When a run's last token was committed, ms after its request started."""
    commits = _commits(events)
    return commits[-1].t_ms if commits else 0.0


def rate_at(events: list, t_ms: float) -> tuple[int, float | None]:
    """(tokens committed by `t_ms`, the tokens/s so far: None before the second token). Past the run's end the
    clock stops at its last commit, so the figure settles on the statistics' tokens/s."""
    done = [c for c in _commits(events) if c.t_ms <= t_ms]
    if not done:
        return 0, None
    n, first = done[-1].n_out, done[0].t_ms
    clock = min(t_ms, end_ms(events)) - first
    return n, (n - 1) / (clock / 1000) if n > 1 and clock > 0 else None


def _pane(name: str, events: list, t_ms: float, css: str) -> str:
    n, rate = rate_at(events, t_ms)
    text = "".join(t for c in _commits(events) if c.t_ms <= t_ms for t in c.texts)
    body = show_text(text) if text else '<span class="dfl-placeholder">reading the prompt…</span>'
    done = t_ms >= end_ms(events)
    speed = f"{rate:.1f} tok/s" if rate is not None else "– tok/s"
    return (f'<div class="race-pane {css}"><div class="race-head"><b>{attr(name)}</b> · {attr(count(n, "token"))} · '
            f'<span class="race-rate">{attr(speed)}</span>{" · done" if done else ""}</div>'
            f'<div class="race-text">{body}</div></div>')


def race_html(run: list, base: list, t_ms: float) -> str:
    """Both panes at playback time `t_ms`, the speedup so far (DFlash's tokens/s over plain decoding's), and how the
    runs were timed. At the end the speedup is the two runs' statistics' ratio, as Compare reports it."""
    _, fast = rate_at(run, t_ms)
    _, slow = rate_at(base, t_ms)
    over = t_ms >= max(end_ms(run), end_ms(base))
    if over:
        fast, slow = run_stats(run)["tokens_per_s"], run_stats(base)["tokens_per_s"]
    speed = f"{fast / slow:.2f}×" if fast and slow else "–"
    head = f"Speedup {'(final)' if over else 'so far'}: <b class=\"race-speedup\">{attr(speed)}</b>"
    return (f'<div class="dfl-race" data-done="{str(over).lower()}"><div class="race-top">{head} '
            f'<span class="race-clock">{t_ms / 1000:.1f} s</span></div><div class="race-panes">'
            f'{_pane("DFlash", run, t_ms, "race-dflash")}{_pane("Plain decoding", base, t_ms, "race-plain")}</div>'
            f'<p class="race-note">{attr(LABEL)}</p></div>')


def playback(run: list, base: list, frame_s: float, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The race's frames, one every `frame_s` of real time, from both runs' start to the slower one's end."""
    stop, start = max(end_ms(run), end_ms(base)), clock()
    while True:
        t = (clock() - start) * 1000
        yield race_html(run, base, min(t, stop))
        if t >= stop:
            return
        sleep(frame_s)
