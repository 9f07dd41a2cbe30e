"""The server's one thread for torch: the playground loads, probes and runs its engines on it.

Why: torch runs its CPU operators on OpenMP, which gives every thread that starts a parallel operator a team of
threads of its own. A server that loads the model on its main thread and runs requests on Gradio's worker threads
ends up with several teams, more OpenMP threads than cores on a small host, and GNU OpenMP then stops spinning
between parallel regions and wakes its threads through the kernel at every one. Measured on a 2-core host: a
200 k-element add took 46 µs instead of 29 µs while a second team lived, the default models' verify forward 88 ms
instead of 74 ms, and the playground streamed ~15 % slower than the same run on one thread. Keeping all of
it on one thread keeps one team (tests/test_app_api.py checks that every forward of a request runs here).

A call made from the torch thread itself runs inline, so nested calls cannot wait on themselves. Nothing that
waits for another request (a lock held by another run) may run here: it would hold up the run it waits for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

NAME = "dflash-torch"


def _new_pool() -> None:
    global _pool
    _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=NAME)


_new_pool()
# A forked child (ZeroGPU's GPU worker) has none of the parent's threads: it starts a torch thread of its own.
os.register_at_fork(after_in_child=_new_pool)


def on_torch_thread() -> bool:
    return threading.current_thread().name.startswith(NAME)


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on the torch thread; its result, or its exception raised here."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    return _pool.submit(fn, *args, **kwargs).result()


class Steps(Iterator):
    """An iterator (an engine's event stream) whose every step, and its close, run on the torch thread."""

    def __init__(self, inner: Iterator):
        self._inner = inner

    def __next__(self) -> Any:
        return call(next, self._inner)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            call(close)
