"""Every number in README.md, BENCHMARKS.md and the draft's TRAINING.md comes from a committed result file through a
script: run the scripts on a copy of the repository and the committed documents come out unchanged (a result
changed without its document, a document edited by hand inside a generated part, or a script that no longer
reproduces what it wrote, fails here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("README.md", "BENCHMARKS.md", "assets/draft-smollm2-135m/TRAINING.md",
             "assets/draft-smollm2-135m/evaluation.json")
SCRIPTS = (["scripts/training_report.py"], ["scripts/benchmarks_headline.py"], ["scripts/host_settings.py", "table"],
           ["scripts/gpu_report.py"])


def test_the_generated_documents_are_what_their_scripts_make_of_the_committed_results(tmp_path):
    copy = tmp_path / "repo"  # another path than the checkout: nothing generated may depend on where it lies
    for part in ("dflash", "scripts", "results", "assets"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, copy / name)
    for argv in SCRIPTS:
        run = subprocess.run([sys.executable, *argv], cwd=copy, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
    stale = [name for name in GENERATED if (copy / name).read_text() != (ROOT / name).read_text()]
    assert not stale, f"regenerate {stale}: python scripts/training_report.py && python scripts/benchmarks_headline.py " \
                      "&& python scripts/host_settings.py table && python scripts/gpu_report.py"
