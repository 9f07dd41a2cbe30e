"""Per-session run control for the playground: the run a session has going (its Stop flag, and whether it is a
generation or a replay), and the generations it has waiting in the server's queue.

Generate and Compare run one at a time on the server, so a request can wait in Gradio's queue for minutes.
`admit` is called when such a request enters the queue (the event's validator, which Gradio runs at enqueue
time) and `take_admission` when its handler starts. Stop in between marks the session's waiting requests, and
each of them then ends at its start without running. The queue is first in, first out, so a session's waiting
requests start in the order they were admitted and a count per session tells which ones Stop reached.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from dflash.errors import BusyError

GENERATION = "generation"
REPLAY = "replay"


@dataclass(frozen=True)
class Stopped:
    running: bool  # a started run was told to stop after its current step
    queued: int  # waiting requests of the session that will end at their start without running


class SessionRuns:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, tuple[threading.Event, str]] = {}  # session → (Stop flag, GENERATION | REPLAY)
        self._waiting: dict[str, int] = {}  # session → requests admitted to the queue and not started yet
        self._stopped: dict[str, int] = {}  # session → how many of the oldest waiting ones Stop reached
        self._looks: dict[threading.Event, Any] = {}  # a running generation's Stop flag → how it is shown (RunLook)

    def admit(self, session: str) -> None:
        """A Generate or Compare request of `session` entered the queue."""
        with self._lock:
            self._waiting[session] = self._waiting.get(session, 0) + 1

    def take_admission(self, session: str) -> bool:
        """A Generate or Compare handler starts: False when Stop reached its request in the queue (it must not
        run). Called first thing, before any validation, so that every admitted request is taken exactly once."""
        with self._lock:
            _decrement(self._waiting, session)
            return not _decrement(self._stopped, session)

    def begin(self, session: str, kind: str, look: Any = None) -> threading.Event:
        """The Stop flag of a run that starts now. A session runs one thing at a time: a starting run stops the
        session's previous one, except that a replay is refused while a generation runs (BusyError). `look`: how a
        generation is shown, which the session's controls may change while it runs (`look`)."""
        with self._lock:
            old = self._active.get(session)
            if old is not None and kind == REPLAY and old[1] == GENERATION:
                raise BusyError("a generation is running in this session: Play replays once it has finished "
                                "(or press Stop first)")
            if old is not None:
                old[0].set()
            flag = threading.Event()
            self._active[session] = (flag, kind)
            if look is not None:
                self._looks[flag] = look
            return flag

    def end(self, session: str, flag: threading.Event) -> None:
        with self._lock:
            self._looks.pop(flag, None)
            if session in self._active and self._active[session][0] is flag:
                del self._active[session]

    def look(self, session: str) -> Any:
        """How the session's running generation is shown (its RunLook), or None when none runs: the replay
        controls then leave the live view alone, and the rejected-tokens switch changes the look."""
        with self._lock:
            active = self._active.get(session)
            return self._looks.get(active[0]) if active is not None and active[1] == GENERATION else None

    def stop(self, session: str) -> Stopped:
        """Stop the session's run after its current step, and every request it has waiting in the queue."""
        with self._lock:
            active = self._active.get(session)
            if active is not None:
                active[0].set()
            waiting = self._waiting.get(session, 0)
            if waiting:
                self._stopped[session] = waiting
            return Stopped(active is not None, waiting)

    def forget(self, session: str) -> None:
        """The session closed: stop its run and drop its counts (its queued requests are dropped with it)."""
        self.stop(session)
        with self._lock:
            self._waiting.pop(session, None)
            self._stopped.pop(session, None)


def _decrement(counts: dict[str, int], session: str) -> bool:
    """Take one from `counts[session]`; False when there was none."""
    n = counts.pop(session, 0)
    if n > 1:
        counts[session] = n - 1
    return n > 0
