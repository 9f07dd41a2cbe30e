"""The decoded traces of all sessions, held under one memory budget.

A session's gr.State keeps its `Replay` (the decoded trace and its cursor); the playground's TraceStore `hold`s every
one, weighed when it comes (`trace_weight`, an estimate of the bytes its objects hold). Past the budget the least
recently used are released first (ui/replay.py `Replay.release`: the trace and its view state are let go), and so is
one unused for `idle_s`; the session gets `message` when it next uses it. API sessions never close, so before this one
visitor loading the largest trace from many sessions held ~114 MB each, up to Gradio's cap of 1,000 sessions. A
Replay that Gradio forgets (the session's state is dropped, or replaced by the next trace) leaves the store with it.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# The objects a Replay holds beside its events (the view state at its cursor, the baseline's), per byte of events:
# measured 1.4-1.6 on the bundled traces and on a 15 MB upload (tracemalloc).
STATE_FACTOR = 1.6


def _scalar(x: Any) -> int:
    """Bytes of one JSON scalar as Python holds it (True, None and small ints are shared)."""
    if x is None or isinstance(x, bool) or (isinstance(x, int) and -5 <= x <= 256):
        return 0
    return sys.getsizeof(x)


def _value(v: Any) -> int:
    if isinstance(v, list):  # list items of one field share a type and about a size: weigh the first
        return 56 + 8 * len(v) + (len(v) * _scalar(v[0]) if v else 0)
    return sys.getsizeof(v) if isinstance(v, dict) else _scalar(v)


def trace_weight(trace: Any) -> int:
    """Estimated bytes a decoded trace and its replay state hold (within ~20% of tracemalloc's count)."""
    total = 0
    for run in (trace.events, trace.baseline or []):
        for e in run:
            fields = e.__dict__
            total += 56 + sys.getsizeof(fields) + sum(_value(v) for v in fields.values())
    return int(total * STATE_FACTOR)


class TraceStore:
    """Every session's Replay, at most `budget` bytes (by `trace_weight`) in all."""

    def __init__(self, budget: int, idle_s: float, message: str, clock: Callable[[], float] = time.monotonic):
        self.budget, self.idle_s, self.message = budget, idle_s, message
        self._clock = clock
        self._lock = threading.RLock()  # a Replay's weakref callback may run (garbage collection) while it is held
        self._entries: OrderedDict[int, tuple[weakref.ref, int, float]] = OrderedDict()  # key → (replay, weight, used)
        self._keys = itertools.count()
        self.used = 0  # bytes of the Replays held

    def hold(self, replay: Any) -> Any:
        """Take `replay` in (releasing the least recently used ones past the budget); returns it."""
        weight, key = trace_weight(replay.trace), next(self._keys)
        with self._lock:
            victims = self._expired()
            while self._entries and self.used + weight > self.budget:
                victims.append(self._pop(next(iter(self._entries))))  # the least recently used first
            self._entries[key] = (weakref.ref(replay, lambda _: self._forget(key)), weight, self._clock())
            self.used += weight
        replay.on_use = lambda: self._touch(key)
        self._release(victims)
        return replay

    def __len__(self) -> int:
        return len(self._entries)

    def _touch(self, key: int) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries[key] = (entry[0], entry[1], self._clock())
                self._entries.move_to_end(key)
            victims = self._expired()
        self._release(victims)

    def _expired(self) -> list:
        """Pop the entries unused for idle_s (call holding the lock); returns their Replays."""
        cutoff, out = self._clock() - self.idle_s, []
        while self._entries and next(iter(self._entries.values()))[2] < cutoff:
            out.append(self._pop(next(iter(self._entries))))
        return out

    def _pop(self, key: int) -> Any:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.used -= entry[1]
        return entry[0]()

    def _release(self, victims: list) -> None:
        """Outside the store's lock: a Replay's own lock is taken, and its holder may be waiting on the store."""
        for replay in victims:
            if replay is not None:
                replay.release(self.message)

    def _forget(self, key: int) -> None:
        with self._lock:
            self._pop(key)


def dropped_message(settings: Any) -> str:
    """What a session whose trace was released reads (`settings`: the playground's Settings)."""
    return (f"This session's trace was let go to free the server's memory (the traces of all sessions share "
            f"{settings.trace_memory_mb:g} MB, the least recently used go first, and one unused for "
            f"{settings.session_idle_s / 60:g} minutes goes too): load the trace again, or press Generate.")
