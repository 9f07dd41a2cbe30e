"""What the train CLI's tests share: a bad option's one-line error."""

from __future__ import annotations

import subprocess


def assert_option_error(proc: subprocess.CompletedProcess, option: str) -> None:
    """Exit status 2, no traceback, and exactly one `error: OPTION: …` line, the last one printed."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {option}:") and proc.stderr.rstrip().endswith(errors[0]), \
        proc.stderr
