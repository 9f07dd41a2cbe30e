"""A live run's look, pacing and status lines: how a run is shown (`RunLook`), when a streaming run redraws
(`FrameThrottle`), and what the status line says while it streams and when it ends."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dflash.decode import events as ev
from . import render


@dataclass
class RunLook:
    """How a run is shown: with its rejected draft tokens or not, recorded for step mode or animated, and the
    hardware line of its statistics. `show_rejected` follows the switch while the run streams (SessionRuns.look)."""

    show_rejected: bool
    step_mode: bool
    hw: str


def hardware(engine) -> str:
    """'model · where · dtype': where it runs and, on a CPU, the settings chosen for the host with the probe's
    numbers (dflash.loading.host). The dtype comes last: a loaded trace's comparison reads it back (`dtype_of`)."""
    t = engine.target
    if t.device.type == "cuda":
        where = torch.cuda.get_device_name(t.device)
    else:
        where = f"CPU, {render.count(torch.get_num_threads(), 'thread')}"
        if engine.host is not None:
            prompts = ", prompts in float32 matmuls" if engine.host.float32_from_rows else ""
            where += f", {engine.host.weights}{prompts}; {engine.host.numbers()}"
    dtype = t.numerics
    mode = " (exact)" if dtype == "float32" else " (fast: identical except at numerical ties)"
    return f"{t.name or 'model'} · {where} · {dtype}{mode if t.device.type == 'cpu' else ''}"


def dtype_of(hardware_line: str) -> str:
    """The dtype at the end of a `hardware` line ('' when there is none)."""
    words = hardware_line.rsplit("·", 1)[-1].split()
    return words[0] if words else ""


class FrameThrottle:
    """When a live run redraws: after a block's commit (the inspector then shows a whole block with its verdict),
    and after each denoising pass only when `watch_steps` (several passes to watch); at most every `refresh_s`.
    The charts, whose every redraw remounts them, only at commits and at most every `plot_refresh_s`.

    Drawing is not free: the engine waits while a frame is built and the server sends it (on a 2-core CPU ~35 ms,
    most of it Gradio's own per-output work), which would cost a fast run a fifth of its speed. So the wait before
    the next frame also stretches to `cost / max_share`, `cost` being the last frame's (`drawn`): drawing then takes
    at most about `max_share` of the run, on any host. `clock` is injectable for tests."""

    def __init__(self, refresh_s: float, plot_refresh_s: float, watch_steps: bool = False, max_share: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.refresh_s, self.plot_refresh_s, self.watch_steps = refresh_s, plot_refresh_s, watch_steps
        self.max_share, self._clock = max_share, clock
        self._last = self._last_plot = -math.inf  # the first commit is always drawn
        self._cost = 0.0

    def due(self, e: ev.Event) -> tuple[bool, bool]:
        """(redraw after event `e`, with the charts)."""
        if not (isinstance(e, ev.Commit) or (self.watch_steps and isinstance(e, ev.DraftStep))):
            return False, False
        now = self._clock()
        if now - self._last < max(self.refresh_s, self._cost / self.max_share):
            return False, False
        self._last = now
        charts = isinstance(e, ev.Commit) and now - self._last_plot >= self.plot_refresh_s
        if charts:
            self._last_plot = now
        return True, charts

    def drawn(self, cost_s: float) -> None:
        """The frame just drawn took `cost_s` seconds of the run (from building it until the engine went on)."""
        self._cost = cost_s

    def frames(self, stream: Iterator[ev.Event], events: list, draw: Callable[[list, bool], Any]) -> Iterator[Any]:
        """Append `stream`'s events to `events`; yield `draw(events, with_charts)` whenever a frame is due, timing
        each frame from its building until the consumer asks for the next."""
        for e in stream:
            events.append(e)
            redraw, charts = self.due(e)
            if redraw:
                start = self._clock()
                yield draw(events, charts)
                self.drawn(self._clock() - start)


def live_status(events: list, what: str = "Generating") -> str:
    commits = [e for e in events if isinstance(e, ev.Commit)]
    if not commits:  # a long prompt's prefill takes a while on a CPU (~50 s for 6,400 tokens on a 2-core AVX2 EPYC)
        started = next((e for e in events if isinstance(e, ev.Started)), None)
        size = f" ({len(started.prompt_ids):,} tokens)" if started is not None else ""
        return f"{what}: reading the prompt{size}…"
    started = render.started(events)
    if started is not None and not started.has_draft:  # one token per target step: no verify steps to count
        return f"{what}: {render.count(commits[-1].n_out, 'token')}…"
    blocks = [e for e in events if isinstance(e, ev.Verify)]
    return f"{what}: {render.count(commits[-1].n_out, 'token')}, {render.count(len(blocks), 'verify step')}…"


def final_status(events: list) -> str:
    fin = render.finished(events)
    s = render.run_stats(events)
    rates = (f" · τ {s['tau']:.2f}" if render.above(s["n_verify"], 0) else "") + (
        f" · {s['tokens_per_s']:.1f} tok/s" if render.above(s["n_output_tokens"], 1) else "")  # undefined: 1 token
    took = f" in {s['total_ms'] / 1000:.1f} s" if s["n_output_tokens"] else ""  # total_ms: to the last commit
    return f"**{render.finish_words(fin)}** {render.count(s['n_output_tokens'], 'token')}{took}{rates}"
