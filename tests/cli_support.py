"""What the CLI's tests share: a bad option's one-line error, and a subprocess that Ctrl-C reaches."""

from __future__ import annotations

import signal
import subprocess


def interruptible() -> None:
    """`preexec_fn` for a CLI run that a test stops with SIGINT, as a terminal's Ctrl-C would: where pytest itself
    runs with SIGINT ignored (`cmd &` in a non-interactive shell), its children inherit the ignore, Python installs
    no KeyboardInterrupt handler and the signal would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def assert_option_error(proc: subprocess.CompletedProcess, option: str) -> None:
    """Exit status 2, no traceback, and exactly one `error: OPTION: …` line, the last one printed."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {option}:") and proc.stderr.rstrip().endswith(errors[0]), \
        proc.stderr
