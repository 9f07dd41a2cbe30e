"""Per-session run control for the playground: the run a session has going (its Stop flag, and whether it is a
generation or a replay), and the generations it has waiting in the server's queue.

Generate and Compare run one at a time on the server, so a request can wait in Gradio's queue for minutes.
`admit` is called when such a request enters the queue (the event's validator, which Gradio runs at enqueue
time) and `take_admission` when its handler starts. Stop in between marks the session's waiting requests, and
each of them then ends at its start without running. A request is known by its ticket, the HTTP request that
queued it (the validator and the handler see the same object): a count would go wrong when a client cancels a
waiting request, which then never starts, and Stop would count it and drop the session's next request instead.
Tickets are held weakly, so a cancelled request's is forgotten with it.

`admit` also bounds the queue: a session may have one generation waiting (beside the one it runs), and all sessions
together `max_waiting`; a request past either is refused as it arrives (BusyError), so it takes no place in the queue.
One client could fill Gradio's queue before (16 places, shared by every event), and every visitor then got "Queue is
full" for every button, replays and trace loading included.
"""

from __future__ import annotations

import threading
import weakref
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
    def __init__(self, max_waiting: int = 8) -> None:
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified when a run ends (`stop_replay` waits on it)
        self._active: dict[str, tuple[threading.Event, str]] = {}  # session → (Stop flag, GENERATION | REPLAY)
        self._waiting: dict[str, weakref.WeakSet] = {}  # session → tickets admitted to the queue, not started yet
        self._stopped: weakref.WeakSet = weakref.WeakSet()  # the waiting tickets that Stop reached
        self._looks: dict[threading.Event, Any] = {}  # a running generation's Stop flag → how it is shown (RunLook)

    def admit(self, session: str, ticket: Any) -> None:
        """A Generate or Compare request of `session` enters the queue; `ticket` names it (see the docstring).
        BusyError: the session already has one waiting, or all sessions together `max_waiting`."""
        if ticket is None:  # no HTTP request to know it by: it is not tracked and runs (take_admission)
            return
        with self._lock:
            if self._waiting.get(session):
                raise BusyError("this session already has a request waiting for its turn: wait for it to start "
                                "(or press Stop)")
            if sum(len(w) for w in self._waiting.values()) >= self.max_waiting:
                raise BusyError(f"the server has {self.max_waiting} requests waiting for their turn: please try "
                                "again in a minute")
            self._waiting.setdefault(session, weakref.WeakSet()).add(ticket)

    def take_admission(self, session: str, ticket: Any = None) -> bool:
        """A Generate or Compare handler starts: False when Stop reached its request in the queue (it must not
        run). Called first thing, before any validation. No ticket (a call from outside the queue): it runs."""
        if ticket is None:
            return True
        with self._lock:
            waiting = self._waiting.get(session)
            if waiting is not None:
                waiting.discard(ticket)
                if not waiting:
                    del self._waiting[session]
            stopped = ticket in self._stopped
            self._stopped.discard(ticket)
            return not stopped

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
            self._ended.notify_all()

    def stop_replay(self, session: str, timeout_s: float = 2.0) -> None:
        """Stop the session's replay, if one plays, and wait until its loop has ended (at most `timeout_s`): every
        frame it sent is then on its way to the page before whatever the caller draws next. A generation is left
        alone (it refuses a replay)."""
        with self._ended:
            active = self._active.get(session)
            if active is None or active[1] != REPLAY:
                return
            active[0].set()
            self._ended.wait_for(lambda: self._active.get(session) is not active, timeout_s)

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
            waiting = self._waiting.pop(session, ())
            self._stopped.update(waiting)
            return Stopped(active is not None, len(waiting))

    def forget(self, session: str) -> None:
        """The session closed: stop its run and its queued requests (Gradio drops those anyway)."""
        self.stop(session)
