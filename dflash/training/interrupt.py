"""Ctrl-C at a step boundary: a long loop that reads memory-mapped shards must not be interrupted inside the reading
(a KeyboardInterrupt raised within safetensors' slicing surfaces as a ValueError traceback), so the signal only sets a
flag, which the loop checks once per step."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deferred_interrupt() -> Iterator[threading.Event]:
    """While inside: the first Ctrl-C sets the event (the loop raises KeyboardInterrupt at its next boundary), a
    second raises at once. Off the main thread, where Python delivers no signal, the event is never set."""
    stop = threading.Event()

    def on_sigint(signum, frame):  # noqa: ARG001 — the signal module's signature
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def shielded() -> Iterator[None]:
    """A short section that Ctrl-C must not cut (reading or writing a shard): a Ctrl-C inside it is raised as
    KeyboardInterrupt when the section ends; a second one, at once."""
    with deferred_interrupt() as stop:
        yield
    if stop.is_set():
        raise KeyboardInterrupt
