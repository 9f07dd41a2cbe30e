"""ui/sessions.py: which of a session's queued requests Stop reached, and one run at a time per session.
(The same behaviour through the app's HTTP API is in tests/test_app_api.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from dflash.errors import BusyError
from ui.sessions import GENERATION, REPLAY, SessionRuns, Stopped


class Ticket:
    """Stands for the HTTP request that queued a Generate (any object that can be weakly referenced)."""


def test_stop_reaches_the_requests_waiting_then_and_no_later_one():
    runs = SessionRuns()
    a, c, other = Ticket(), Ticket(), Ticket()
    runs.admit("s", a)
    runs.admit("other", other)
    assert runs.stop("s") == Stopped(running=False, queued=1)
    runs.admit("s", c)  # pressed Generate again after Stop
    assert [runs.take_admission("s", t) for t in (a, c)] == [False, True]
    assert runs.take_admission("other", other)
    assert runs.stop("s") == Stopped(running=False, queued=0)


def test_one_request_waits_per_session_and_max_waiting_in_all():
    runs = SessionRuns(max_waiting=2)
    a, b, c, d = Ticket(), Ticket(), Ticket(), Ticket()
    runs.admit("s", a)
    with pytest.raises(BusyError, match="this session already has a request waiting for its turn"):
        runs.admit("s", b)
    runs.admit("t", c)
    with pytest.raises(BusyError, match="the server has 2 requests waiting for their turn: please try again"):
        runs.admit("u", d)
    assert runs.take_admission("s", a)  # a starts: the session may queue its next one, and so may another
    runs.admit("s", b)
    del c  # a request cancelled while it waited leaves its place
    runs.admit("u", d)


def test_a_cancelled_request_is_forgotten_with_its_ticket():
    """A request cancelled while it waits never starts: Stop neither counts it nor marks a later request for it."""
    runs = SessionRuns()
    cancelled, later = Ticket(), Ticket()
    runs.admit("s", cancelled)
    del cancelled  # Gradio dropped the request
    assert runs.stop("s") == Stopped(running=False, queued=0)
    runs.admit("s", later)
    assert runs.take_admission("s", later)


def test_a_handler_called_without_the_queue_runs():
    assert SessionRuns().take_admission("s")  # nothing admitted (a direct call): nothing to stop


def test_stop_sets_the_flag_of_the_running_run_only():
    runs = SessionRuns()
    flag = runs.begin("s", GENERATION)
    other = runs.begin("t", GENERATION)
    assert runs.stop("s") == Stopped(running=True, queued=0)
    assert flag.is_set() and not other.is_set()
    runs.end("s", flag)
    assert runs.stop("s") == Stopped(running=False, queued=0)


def test_a_replay_is_refused_while_a_generation_runs_and_a_generation_stops_a_replay():
    runs = SessionRuns()
    gen = runs.begin("s", GENERATION)
    with pytest.raises(BusyError, match="a generation is running in this session"):
        runs.begin("s", REPLAY)
    assert not gen.is_set()
    runs.end("s", gen)
    replay = runs.begin("s", REPLAY)
    newer = runs.begin("s", REPLAY)
    assert replay.is_set() and not newer.is_set()  # a new replay replaces the old one
    generation = runs.begin("s", GENERATION)
    assert newer.is_set() and not generation.is_set()  # a generation stops the running replay


def test_stop_replay_returns_once_the_replay_loop_has_ended():
    """Pause and the frame controls wait for the playing loop to end, so its last frame reaches the page before theirs
    (Gradio's own cancel raced its closing message and showed "Error"); a generation is left alone."""
    runs = SessionRuns()
    flag, ended = runs.begin("s", REPLAY), []

    def loop():  # a replay's loop: it sees the flag between frames, then ends
        flag.wait()
        time.sleep(0.2)
        ended.append(time.monotonic())
        runs.end("s", flag)

    thread = threading.Thread(target=loop)
    thread.start()
    runs.stop_replay("s")
    returned = time.monotonic()
    thread.join()
    assert flag.is_set() and ended and ended[0] <= returned
    stuck = runs.begin("s", REPLAY)  # a loop that never ends: the wait is bounded
    start = time.monotonic()
    runs.stop_replay("s", timeout_s=0.2)
    assert stuck.is_set() and 0.2 <= time.monotonic() - start < 2
    runs.end("s", stuck)
    gen = runs.begin("s", GENERATION)
    runs.stop_replay("s")
    assert not gen.is_set()


def test_forget_stops_the_run_and_its_queued_requests():
    runs = SessionRuns()
    flag = runs.begin("s", GENERATION)
    queued, later = Ticket(), Ticket()
    runs.admit("s", queued)
    runs.forget("s")
    assert flag.is_set() and not runs.take_admission("s", queued)
    assert runs.take_admission("s", later)  # nothing was left marked for a later request
