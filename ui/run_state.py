"""The events of one run so far, folded one at a time into what the views read (ui/render*.py, ui/plots.py).

A replay moves forward by feeding only a frame's own events to `RunState.add`, and back by `undo`-ing them, so
drawing frame k does not go through frames 0…k-1 again; `RunState.of(events)` builds the state of a whole list,
and every render function takes either. The event list itself is not kept: only what the views read (each
block's events, the verify and commit events in order, running counts and the running statistics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash.decode import events as ev
from dflash.decode.stats import RunningStats


@dataclass
class BlockInfo:
    """Everything the events say about one block (block 0 = the prefill's first token)."""

    block: int
    size: ev.BlockSize | None = None
    steps: list[ev.DraftStep] = field(default_factory=list)
    verify: ev.Verify | None = None
    commit: ev.Commit | None = None


_BLOCK_EVENTS = (ev.BlockSize, ev.DraftStep, ev.Verify, ev.Commit)


@dataclass
class PositionCounts:
    """Per proposed position k ([k-1]) of one source's blocks: how many proposed k, reached it (every earlier
    position accepted) and accepted it."""

    proposed: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def add(self, n: int, accepted_len: int) -> None:
        """One verify of `n` proposed tokens of which the first `accepted_len` were accepted."""
        for counts in (self.proposed, self.reached, self.accepted):
            counts.extend([0] * (n - len(counts)))
        for k in range(1, n + 1):
            self.proposed[k - 1] += 1
            self.reached[k - 1] += accepted_len >= k - 1
            self.accepted[k - 1] += accepted_len >= k

    def copy(self) -> PositionCounts:
        return PositionCounts(list(self.proposed), list(self.reached), list(self.accepted))


class RunState:
    """What the views read from a run's events so far; `add` takes the next event and, when `undoable`, `undo`
    takes the latest one back (a replay stepping back)."""

    def __init__(self, undoable: bool = False) -> None:
        self.n_events = 0
        self.started: ev.Started | None = None
        self.prefill: ev.Prefill | None = None
        self.finished: ev.Finished | None = None  # set only while the latest event is Finished
        self.blocks: dict[int, BlockInfo] = {}
        self.latest_block: int | None = None
        self.verifies: list[ev.Verify] = []
        self.commits: list[ev.Commit] = []
        self.max_size = 0  # largest BlockSize so far
        # Controller decisions that changed the size at a verify step (not the clip to the tokens left at the end),
        # each against the previous block of the same source: drafted and copied blocks have a controller each.
        self.size_changes: list[ev.BlockSize] = []
        self._prev_size: dict[str, int] = {}  # source → the size of its latest block
        # Per block source (drafted or copied from the context) and per position k ([k-1]): blocks that proposed
        # k, reached it (all earlier accepted), accepted it.
        self.positions: dict[str, PositionCounts] = {}
        self.cache: dict[Any, Any] = {}  # what render functions keep between frames (token spans)
        self.running = RunningStats()
        self._stats: tuple[int, dict[str, Any]] | None = None
        self._marks: list[tuple] | None = [] if undoable else None  # per event added: what `undo` restores

    @classmethod
    def of(cls, events: list) -> RunState:
        state = cls()
        for e in events:
            state.add(e)
        return state

    def add(self, e: ev.Event) -> None:
        if self._marks is not None:
            self._marks.append(self._mark(e))
        self.n_events += 1
        self.finished = e if isinstance(e, ev.Finished) else None
        if isinstance(e, ev.Started):
            self.started = self.started or e
        elif isinstance(e, ev.Prefill):
            self.prefill = self.prefill or e
        elif isinstance(e, _BLOCK_EVENTS):
            self._block_event(e)

    def _mark(self, e: ev.Event) -> tuple:
        """Everything adding `e` changes, as it is now: the scalars, the lengths of the lists that only grow, the
        touched block's fields, and for a verify step the per-position counts (at most MAX_BLOCK_SIZE each)."""
        block = running = counts = None
        if isinstance(e, _BLOCK_EVENTS):
            info = self.blocks.get(e.block)
            block = (e.block, info and (info.size, len(info.steps), info.verify, info.commit))
        if isinstance(e, (ev.Verify, ev.Commit)):
            running = self.running.mark(counts=isinstance(e, ev.Verify))
        if isinstance(e, ev.Verify):
            counts = {src: c.copy() for src, c in self.positions.items()}
        return (self.n_events, self.started, self.prefill, self.finished, self.latest_block, self.max_size,
                dict(self._prev_size), len(self.verifies), len(self.commits), len(self.size_changes), block, running, counts)

    def undo(self) -> None:
        """Take back the latest event added (needs `undoable`); the cost is that event's, not the run's."""
        (self.n_events, self.started, self.prefill, self.finished, self.latest_block, self.max_size, self._prev_size,
         n_verifies, n_commits, n_changes, block, running, counts) = self._marks.pop()
        del self.verifies[n_verifies:], self.commits[n_commits:], self.size_changes[n_changes:]
        if block is not None:
            number, was = block
            if was is None:
                del self.blocks[number]
            else:
                info = self.blocks[number]
                info.size, n_steps, info.verify, info.commit = was
                del info.steps[n_steps:]
        if running is not None:
            self.running.restore(running)
        if counts is not None:
            self.positions = counts
        self._stats = None

    def _block_event(self, e: ev.BlockSize | ev.DraftStep | ev.Verify | ev.Commit) -> None:
        info = self.blocks.get(e.block)
        if info is None:
            info = self.blocks[e.block] = BlockInfo(e.block)
            self.latest_block = e.block if self.latest_block is None else max(self.latest_block, e.block)
        if isinstance(e, ev.BlockSize):
            info.size = e
            self.max_size = max(self.max_size, e.size)
        elif isinstance(e, ev.DraftStep):
            info.steps.append(e)
        elif isinstance(e, ev.Verify):
            info.verify = e
            self.verifies.append(e)
            self.running.verify(e)
            self._count_positions(e)
            self._note_change(e)
        else:
            info.commit = e
            self.commits.append(e)
            self.running.commit(e, info.verify)

    def _count_positions(self, v: ev.Verify) -> None:
        self.positions.setdefault(v.source, PositionCounts()).add(len(v.draft_tokens), v.accepted_len)

    def position_counts(self, source: str = ev.DRAFT) -> PositionCounts:
        """The per-position counts of the blocks `source` proposed (empty when it proposed none)."""
        return self.positions.get(source, PositionCounts())

    def _note_change(self, v: ev.Verify) -> None:
        d = self.blocks[v.block].size
        if d is None:
            return
        prev = self._prev_size.get(d.source)
        if prev is not None and d.size != prev and "clipped" not in d.reason:
            self.size_changes.append(d)
        self._prev_size[d.source] = d.size

    def stats(self) -> dict[str, Any]:
        """compute_stats of the events so far (cached until the next event; treat it as read-only)."""
        if self._stats is None or self._stats[0] != self.n_events:
            self._stats = (self.n_events, self.running.result(self.started, self.prefill))
        return self._stats[1]


def as_state(run: RunState | list) -> RunState:
    """A render function's input: a RunState as it is, a list of events folded into a new one."""
    return run if isinstance(run, RunState) else RunState.of(run)
