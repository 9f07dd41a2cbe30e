"""Ctrl-C during `train fit` stops at a step boundary, and `train data` / `data-tf` finish reading or writing a shard
(dflash/training/interrupt.py): inside the reading of a shard it
surfaced as a ValueError traceback from safetensors (seen in CI) instead of the one-line "interrupted"."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from dflash.training.interrupt import deferred_interrupt, shielded


def test_the_first_ctrl_c_sets_the_flag_the_second_raises_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGINT)
    with deferred_interrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to this (the main) thread before kill returns to Python code
        assert stop.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)  # the handler runs here at the latest
    assert signal.getsignal(signal.SIGINT) is before


def test_off_the_main_thread_it_changes_nothing():
    seen = []

    def run():
        with deferred_interrupt() as stop:
            seen.append(stop.is_set())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [False]


def test_a_ctrl_c_inside_a_shielded_section_is_raised_when_it_ends():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with shielded():
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(0.2)  # the handler has run by now; the section goes on
            done.append("the section finished")
    assert done == ["the section finished"]
