"""ui/torch_thread.py: every call and every step of a wrapped stream runs on the one torch thread, results and
exceptions come back to the caller, and a call from the torch thread itself runs inline instead of waiting on
itself. (That the playground's forwards all run there is tested through HTTP in tests/test_app_api.py.)"""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from ui import torch_thread


def in_other_thread(fn):
    """fn() on a fresh thread, joined with a timeout: a deadlock fails the test instead of hanging it."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the call did not return"
    return out[0]


def test_calls_from_any_thread_run_on_the_one_torch_thread():
    here = torch_thread.call(threading.get_ident)
    assert here != threading.get_ident()
    assert in_other_thread(lambda: torch_thread.call(threading.get_ident)) == here
    assert torch_thread.call(lambda: threading.current_thread().name).startswith(torch_thread.NAME)
    assert torch_thread.call(divmod, 7, 2) == (3, 1)


def test_exceptions_reach_the_caller_and_the_thread_keeps_serving():
    with pytest.raises(ZeroDivisionError):
        torch_thread.call(lambda: 1 / 0)
    assert torch_thread.call(lambda: 2) == 2


def test_a_call_from_the_torch_thread_runs_inline():
    nested = in_other_thread(lambda: torch_thread.call(lambda: torch_thread.call(threading.get_ident)))
    assert nested == torch_thread.call(threading.get_ident)


def test_steps_and_close_of_a_stream_run_on_the_torch_thread():
    seen: list[str] = []

    def stream():
        try:
            for i in range(5):
                seen.append(threading.current_thread().name)
                yield i
        finally:
            seen.append("closed on " + threading.current_thread().name)

    steps = torch_thread.Steps(stream())
    assert [next(steps), next(steps)] == [0, 1]
    steps.close()
    assert len(seen) == 3 and all(torch_thread.NAME in name for name in seen)
    assert seen[-1].startswith("closed on ")
    assert list(torch_thread.Steps(iter([1, 2]))) == [1, 2]  # plain iterators too (no close)


def test_a_forked_child_gets_a_torch_thread_of_its_own():
    """ZeroGPU runs requests in a forked worker, which has none of the parent's threads."""
    torch_thread.call(int)  # the parent's torch thread exists
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a call must run, not wait for a thread that was not forked
        try:
            os.write(w, str(torch_thread.call(lambda: 41 + 1)).encode())
        finally:
            os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 20)
    got = os.read(r, 16) if ready else b"(no answer: the call waited for a thread the fork did not copy)"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert got == b"42"
