"""`python -m dflash sweep` on tiny random models: a grid end to end (JSON, CSV, chart), one-line errors, Ctrl-C keeping
the finished cells and --resume finishing without measuring them again, --max-seconds. A run and Ctrl-C go through a
subprocess, as a user runs them; option errors and the resume after Ctrl-C through `main(argv)` in this process."""

from __future__ import annotations

import json
import os
import signal
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash.bench.sweep import load_sweep
from tests.cli_support import assert_option_error, interruptible, run_main
from tests.test_bench_cli import PROMPTS, models, write_jsonl  # noqa: F401 (models: the tiny models and prompts)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def sweep_argv(d: Path, out: Path, *extra: str, prompts: Path | None = None) -> list[str]:
    return ["sweep", "--target", str(d / "target"), "--draft", str(d / "draft"), "--prompts",
            str(prompts or d / "prompts.jsonl"), "--max-new-tokens", "8", "--repeats", "2", "--threads", "1",
            "--dtype", "float32", "--no-progress", "--output", str(out), *extra]


def sweep_process(d: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash", *sweep_argv(d, out, *extra)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture
def sweep(capsys):
    """`sweep(d, out, *extra)`: the command through `main(argv)` in this process."""
    from dflash.cli import main

    return lambda d, out, *extra: run_main(main, sweep_argv(d, out, *extra), capsys)


def test_a_two_by_one_grid_end_to_end(models, tmp_path):
    out, csv, png = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "s.png"
    proc = sweep_process(models, out, "--set", "block_size=2,4", "--set", "lookup_ngram=0", "--csv", str(csv),
                         "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    doc = load_sweep(out.read_text())
    assert doc["complete"] and [c["key"] for c in doc["cells"]] == ["block_size=2|lookup_ngram=0",
                                                                   "block_size=4|lookup_ngram=0"]
    assert all(c["identical"] and c["n"] == 4 and not c["lossy"] for c in doc["cells"])  # float32: exact
    assert doc["best"] in {c["key"] for c in doc["cells"]} and doc["models"]["trained_block_size"] == 6
    assert doc["host"]["cpu_model"] and doc["spec"]["conditions"]["dtype"] == "float32"
    assert "estimate: at most" in proc.stderr and proc.stderr.count("identical") == 2
    assert doc["command"] == shlex.join(["python", "-m", "dflash", *proc.args[3:]])  # as typed: to run it again
    assert f"best lossless: {doc['best']}" in proc.stdout
    rows = csv.read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("block_size,lookup_ngram,key,n,")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_set_exits_2_with_one_line(models, tmp_path, sweep):
    """Named before any model loads."""
    proc = sweep(models, tmp_path / "s.json", "--set", "block_size=2,100")
    assert_option_error(proc, "--set")
    assert "block_size: must be in [1, 64], got 100" in proc.stderr and not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("extra, option, words", [
    (["--set", "blocksize=2"], "--set", "unknown parameter 'blocksize'"),
    (["--set", "block_size=2,x"], "--set", "block_size: must be an integer, got 'x'"),
    (["--set", "block_size=2", "--set", "block_size=4"], "--set", "each parameter at most once"),
    ([], "--set", "give 1 to 3 settings"),
    (["--set", "block_size=2", "--fix", "block_size=4"], "--fix", "varied by the grid"),
    (["--set", "block_size=2", "--fix", "adaptive=fixed,cost"], "--fix", "one value"),
    (["--set", "acceptance_threshold=1,0.5", "--fix", "verify=rejection"], "--fix", "unknown parameter 'verify'"),
    (["--set", "block_size=2", "--limit", "0"], "--limit", "must be >= 1"),
    (["--set", "block_size=2", "--repeats", "0"], "--repeats", "[1, 100]"),
    (["--set", "block_size=2", "--plot", "chart.gif"], "--plot", ".png"),
    (["--set", "block_size=2", "--no-draft"], "--no-draft", "runs the no-draft loop itself"),
    (["--set", "block_size=4,8"], "--set", "block_size"),  # needs the models: the draft verifies blocks of 6 at most
])
def test_bad_options_are_named_in_one_line(models, tmp_path, sweep, extra, option, words):
    proc = sweep(models, tmp_path / "s.json", *extra)
    assert_option_error(proc, option)
    assert words in proc.stderr and not (tmp_path / "s.json").exists()


def test_a_grid_over_max_seconds_is_refused_with_its_estimate(models, tmp_path, sweep):
    proc = sweep(models, tmp_path / "s.json", "--set", "block_size=2,3,4", "--max-seconds", "0.001")
    assert_option_error(proc, "--max-seconds")
    assert "the grid's estimate" in proc.stderr and "estimate: at most" in proc.stderr
    assert not (tmp_path / "s.json").exists()


def test_ctrl_c_keeps_the_finished_cells_and_resume_finishes_without_them(models, tmp_path, capsys):
    """SIGINT once the first cell is written: exit 130 with the cells finished so far, in one line; --resume (in this
    process) measures only the others (the kept cell's samples, timings included, are those of the first process)."""
    from dflash.cli import main

    prompts = write_jsonl(tmp_path / "many.jsonl", PROMPTS * 4)
    out = tmp_path / "s.json"
    argv = sweep_argv(models, out, "--set", "block_size=2,3,4", "--max-new-tokens", "24", "--repeats", "1",
                      prompts=prompts)
    proc = subprocess.Popen([sys.executable, "-m", "dflash", *argv], cwd=ROOT, env=ENV, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 180
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and "Traceback" not in err, err
    kept = load_sweep(out.read_text())["cells"]
    assert 1 <= len(kept) < 3 and not load_sweep(out.read_text())["complete"]
    assert err.rstrip().endswith(f"interrupted: {len(kept)} of 3 cells saved in {out}; the same command with --resume "
                                 "continues it"), err
    again = run_main(main, [*argv, "--resume"], capsys)
    assert again.returncode == 0, again.stderr
    doc = load_sweep(out.read_text())
    assert doc["complete"] and [c["key"] for c in doc["cells"]] == ["block_size=2", "block_size=3", "block_size=4"]
    assert doc["cells"][: len(kept)] == kept
    assert again.stderr.count("[read back]") == len(kept)
    assert "estimate: at most" in again.stderr and f"for {3 - len(kept)} cells" in again.stderr


def test_resume_refuses_another_grid_and_replots_a_complete_one(models, tmp_path, sweep):
    out, png = tmp_path / "s.json", tmp_path / "again.png"
    assert sweep(models, out, "--set", "block_size=2", "--repeats", "1").returncode == 0
    before = out.read_bytes()
    proc = sweep(models, out, "--set", "block_size=2,4", "--repeats", "1", "--resume")
    assert_option_error(proc, "--resume")
    assert "axes (was" in proc.stderr and "--overwrite" in proc.stderr
    for bad in ("[1, 2]", "not json"):
        out.write_text(bad)
        assert_option_error(sweep(models, out, "--resume"), "--resume")
    out.write_bytes(before)
    proc = sweep(models, out, "--resume", "--plot", str(png))  # no --set: the file's grid; nothing to measure
    assert proc.returncode == 0 and "nothing to resume" in proc.stderr, proc.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and out.read_bytes() == before
