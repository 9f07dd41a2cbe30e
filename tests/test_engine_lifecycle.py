"""Lifecycle: cancel, deadline, out-of-memory, one request at a time, closing a stream."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.errors import BusyError
from dflash.decode.events import Commit, Finished
from dflash.decode.request import Request
from engine_helpers import FailingTarget, reference_greedy

PROMPT = (3, 1, 4, 1, 5)
REQ = Request(prompt_ids=PROMPT, max_new_tokens=24, block_size=4)


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=4)


@pytest.fixture(scope="module")
def expected(target):
    return reference_greedy(target, list(PROMPT), 24)


@pytest.fixture
def engine(target):
    return Engine(target, tiny_draft(target, block_size=8))


def test_cancel_after_step_two(engine, expected):
    cancel = threading.Event()
    events = []
    for e in engine.stream(REQ, cancel):
        events.append(e)
        if isinstance(e, Commit) and e.block == 2:
            cancel.set()
            after = []
            continue
        if cancel.is_set():
            after.append(e)
    assert [type(e) for e in after] == [Finished], "Finished must come within one step of the cancel"
    fin = events[-1]
    assert fin.reason == "cancelled" and fin.message
    assert 0 < len(fin.output_ids) < len(expected)
    assert fin.output_ids == expected[: len(fin.output_ids)]
    assert fin.output_ids == [t for e in events if isinstance(e, Commit) for t in e.token_ids]
    assert not engine._lock.locked()
    assert engine.generate(REQ).output_ids == expected


def test_cancel_before_start(engine):
    cancel = threading.Event()
    cancel.set()
    fin = engine.generate(REQ, cancel)
    assert fin.finish_reason == "cancelled" and fin.output_ids == []  # nothing ran, not even the prefill


def test_deadline(engine, expected):
    now = [1000.0]
    engine.clock = lambda: now[0]
    events = []
    for e in engine.stream(Request(prompt_ids=PROMPT, max_new_tokens=24, block_size=4, deadline_s=5.0)):
        events.append(e)
        if isinstance(e, Commit) and e.block == 2:
            now[0] += 5.5  # past the deadline after the second block
    fin = events[-1]
    assert fin.reason == "timeout" and "deadline" in fin.message
    assert isinstance(events[-2], Commit) and events[-2].block == 2
    assert fin.output_ids == expected[: len(fin.output_ids)]


@pytest.mark.parametrize("fail_at", [1, 3])
def test_out_of_memory_once_then_recovers(target, expected, fail_at):
    failing = FailingTarget(target.model, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                                                 "(/usr/lib/python3/site-packages/torch/x.py)"), fail_at)
    engine = Engine(failing, tiny_draft(failing, block_size=8))
    res = engine.generate(REQ)
    assert res.finish_reason == "error"
    assert "out of memory" in res.message
    assert "/" not in res.message and "Traceback" not in res.message and ".py" not in res.message
    assert isinstance(res.events[-1], Finished)
    assert res.output_ids == expected[: len(res.output_ids)]
    assert not engine._lock.locked()
    again = engine.generate(REQ)
    assert again.finish_reason == "length" and again.output_ids == expected


def test_unexpected_error_message_is_sanitised(target, expected):
    failing = FailingTarget(target.model, RuntimeError("bad thing at /secret/path/model.py line 3"), 2)
    engine = Engine(failing, tiny_draft(failing, block_size=8))
    res = engine.generate(REQ)
    assert res.finish_reason == "error" and res.message
    assert "/secret" not in res.message and "Traceback" not in res.message
    assert engine.generate(REQ).output_ids == expected


def test_lock_blocking_waits_and_non_blocking_raises(engine, expected):
    holder = engine.stream(REQ)
    first_two = [next(holder), next(holder)]  # the stream now holds the lock mid-run
    assert len(first_two) == 2
    with pytest.raises(BusyError):
        engine.stream(REQ, blocking=False)
    results = {}

    def waiter():
        results["res"] = engine.generate(REQ)  # blocking: waits for the lock

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and "res" not in results, "a blocking request must wait for the running one"
    rest = list(holder)
    assert rest[-1].output_ids == expected
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert results["res"].output_ids == expected
    assert not engine._lock.locked()
    assert engine.generate(REQ).output_ids == expected


def test_two_threads_at_once(engine, expected):
    """Two threads call generate together: both finish with correct output, one after the other."""
    out, errors = [], []

    def call(blocking: bool):
        try:
            out.append(list(e for e in engine.stream(REQ, blocking=blocking))[-1].output_ids)
        except BusyError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(True,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert out == [expected, expected] and not errors
    assert not engine._lock.locked()


def test_stream_close_releases_lock(engine, expected):
    stream = engine.stream(REQ)
    next(stream), next(stream)
    assert engine._lock.locked()
    stream.close()
    assert not engine._lock.locked()
    assert engine.generate(REQ, ).output_ids == expected


def test_stream_never_iterated_releases_lock(engine, expected):
    """A stream closed (or dropped) before its first event must not keep the engine locked forever."""
    stream = engine.stream(REQ)
    stream.close()
    assert not engine._lock.locked()
    stream = engine.stream(REQ)
    del stream
    import gc

    gc.collect()
    assert not engine._lock.locked()
    assert list(engine.stream(REQ, blocking=False))[-1].output_ids == expected


def test_validation_error_does_not_take_the_lock(engine):
    with pytest.raises(ValueError):
        engine.stream(Request(prompt_ids=(300,), max_new_tokens=3))  # id >= vocab 256
    assert not engine._lock.locked()


def test_stream_left_open_in_this_thread_raises_instead_of_waiting_forever(engine, expected):
    """A loop broken out of (or left by an exception) keeps its stream, and so the lock, while the stream is still
    referenced. A blocking request from that same thread then waited forever; it is a BusyError that says why."""
    import signal

    def hung(*_):
        raise TimeoutError("waited for a lock only this thread can release")

    stream = engine.stream(REQ)
    for e in stream:
        if isinstance(e, Commit):
            break
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(BusyError, match="close"):
            engine.generate(REQ)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert next(stream)  # the open stream is untouched and goes on
    stream.close()
    assert engine.generate(REQ).output_ids == expected


def _holding(engine):
    """A stream suspended mid-run: it holds the engine until it is read on or closed."""
    holder = engine.stream(REQ)
    next(holder), next(holder)
    assert engine._lock.locked()
    return holder


@pytest.mark.parametrize("stop", ["cancel", "deadline"])
def test_a_request_waiting_for_the_engine_is_stopped_by_cancel_or_its_deadline(engine, expected, stop):
    """While another request holds the engine, a waiting request's Stop and deadline count: it finishes
    ("cancelled" / "timeout") without a prefill or a token, as a run stopped during its prefill does (Started,
    Finished). Before: it waited for the lock whatever happened, and its deadline started only once it had it.
    The deadline runs on an injected clock, moved past it once the waiting call has begun: no timing assumption."""
    now = [1000.0]
    engine.clock = lambda: now[0]
    holder = _holding(engine)
    cancel, called, results = threading.Event(), threading.Event(), {}
    request = Request(prompt_ids=PROMPT, max_new_tokens=24, block_size=4, deadline_s=5.0)

    def waiter():
        stream = engine.stream(request, cancel)  # the deadline counts from this call
        called.set()
        results["events"] = list(stream)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        assert called.wait(30)
        cancel.set() if stop == "cancel" else now.__setitem__(0, 1006.0)
        thread.join(timeout=30)
        assert not thread.is_alive(), "a waiting request must give up when stopped, not wait for the running one"
        events = results["events"]
        assert [type(e).__name__ for e in events] == ["Started", "Finished"]
        fin = events[-1]
        assert fin.reason == ("cancelled" if stop == "cancel" else "timeout") and "waiting" in fin.message
        assert (fin.output_ids, fin.text, fin.stats["n_output_tokens"]) == ([], "", 0)
        assert engine._lock.locked(), "the running request keeps the engine"
    finally:
        rest = list(holder)
        thread.join(timeout=60)
    assert rest[-1].reason == "length" and rest[-1].output_ids == expected
    assert not engine._lock.locked()
    assert engine.generate(REQ).output_ids == expected


def test_a_waiting_request_runs_normally_once_the_engine_is_free(engine, expected):
    """Waiting polls the lock: a request that is neither stopped nor past its deadline still runs in full."""
    holder = _holding(engine)
    results = {}
    thread = threading.Thread(target=lambda: results.update(res=engine.generate(REQ)))
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()
    assert list(holder)[-1].output_ids == expected
    thread.join(timeout=60)
    assert results["res"].finish_reason == "length" and results["res"].output_ids == expected
