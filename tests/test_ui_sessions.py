"""ui/sessions.py: which of a session's queued requests Stop reached, and one run at a time per session.
(The same behaviour through the app's HTTP API is in tests/test_app_api.py.)"""

from __future__ import annotations

import pytest

from dflash.errors import BusyError
from ui.sessions import GENERATION, REPLAY, SessionRuns, Stopped


def test_stop_reaches_the_requests_waiting_then_and_no_later_one():
    runs = SessionRuns()
    runs.admit("s")
    runs.admit("s")
    runs.admit("other")
    assert runs.stop("s") == Stopped(running=False, queued=2)
    runs.admit("s")  # pressed Generate again after Stop
    assert [runs.take_admission("s") for _ in range(3)] == [False, False, True]  # first in, first out
    assert runs.take_admission("other")
    assert runs.stop("s") == Stopped(running=False, queued=0)


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


def test_forget_stops_the_run_and_drops_the_counts():
    runs = SessionRuns()
    flag = runs.begin("s", GENERATION)
    runs.admit("s")
    runs.forget("s")
    assert flag.is_set()
    assert runs.take_admission("s")  # nothing was left marked for a later request
