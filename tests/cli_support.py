"""What the CLI's tests share: a bad option's one-line error, a command run in-process (with `train`'s log on its
stderr), and a subprocess that Ctrl-C reaches."""

from __future__ import annotations

import logging
import resource
import signal
import subprocess
import sys
from contextlib import contextmanager


def interruptible() -> None:
    """`preexec_fn` for a CLI run that a test stops with SIGINT, as a terminal's Ctrl-C would: where pytest itself
    runs with SIGINT ignored (`cmd &` in a non-interactive shell), its children inherit the ignore, Python installs
    no KeyboardInterrupt handler and the signal would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def capped_memory(gigabytes: float = 12):
    """`preexec_fn` capping a CLI run's address space: a test proving that nothing large is allocated fails with a
    MemoryError where the code would allocate (say 25 GB for a hostile draft config), instead of exhausting the
    shared machine's memory."""
    size = int(gigabytes * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (size, size))


def run_main(main, argv: list[str], capsys) -> subprocess.CompletedProcess:
    """A command's `main(argv)` run in this process, read back as a subprocess's result (exit status, stdout, stderr):
    option and validation errors are tested without a fresh interpreter's 3-4 s of imports. An exception main lets
    out fails the test, as a traceback would. Torch's thread count, which a command sets, is restored."""
    import torch

    capsys.readouterr()  # what the test printed before is not the command's
    threads = torch.get_num_threads()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's errors and --help
        code = exc.code
    finally:
        torch.set_num_threads(threads)
    if isinstance(code, str):  # SystemExit("message"): Python prints it on stderr and exits with status 1
        print(code, file=sys.stderr)
        code = 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, 0 if code is None else code, out, err)


def assert_option_error(proc: subprocess.CompletedProcess, option: str) -> None:
    """Exit status 2, no traceback, and exactly one `error: OPTION: …` line, the last one printed."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {option}:") and proc.stderr.rstrip().endswith(errors[0]), \
        proc.stderr


@contextmanager
def train_log_on_stderr():
    """For a `train` command run in this process: its log on sys.stderr (the stream capsys reads) from INFO up, as
    `train`'s logging.basicConfig puts it in a fresh process (here pytest's own log handlers make that call a no-op)."""
    root, handler = logging.getLogger(), logging.StreamHandler(sys.stderr)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
