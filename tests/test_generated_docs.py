"""Every number in README.md, BENCHMARKS.md and the draft's TRAINING.md comes from a committed result file through a
script: run the scripts on a copy of the repository and the committed documents come out unchanged (a result
changed without its document, a document edited by hand inside a generated part, or a script that no longer
reproduces what it wrote, fails here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("README.md", "BENCHMARKS.md", "assets/draft-smollm2-135m/TRAINING.md",
             "assets/draft-smollm2-135m/evaluation.json")
SCRIPTS = (["scripts/training_report.py"], ["scripts/benchmarks_headline.py"], ["scripts/host_settings.py", "table"],
           ["scripts/gpu_report.py"], ["scripts/sweep_report.py"])


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
                      "&& python scripts/host_settings.py table && python scripts/gpu_report.py && python scripts/sweep_report.py"


# -- sizes: documents a newcomer reads through ------------------------------------------------------------------------
LIMITS = {"README.md": 6_000, "BENCHMARKS.md": 25_000}  # characters, front matter included
LONGEST_LINE = 400
LONGEST_README_SENTENCE = 45  # words


def prose(markdown: str) -> str:
    """The text a reader reads as sentences: no front matter, code blocks, tables, headings or comments."""
    text = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.DOTALL)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return "\n".join(line for line in text.splitlines() if not line.startswith(("|", "#", "<!--", "![")))


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_the_front_documents_stay_within_their_sizes(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert len(text) <= LIMITS[name], f"{name}: {len(text):,} characters, over {LIMITS[name]:,}"
    long = [i for i, line in enumerate(text.splitlines(), 1) if len(line) > LONGEST_LINE]
    assert not long, f"{name}: lines over {LONGEST_LINE} characters: {long}"


def test_no_readme_sentence_runs_over_45_words():
    blocks = re.split(r"\n\s*\n|\n(?=- |\d+\. )", prose((ROOT / "README.md").read_text(encoding="utf-8")))  # paragraphs, items
    sentences = [s for b in blocks for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[])", " ".join(b.split()))]
    long = [s for s in sentences if len(s.split()) > LONGEST_README_SENTENCE]
    assert not long, long


def test_the_readmes_layout_names_every_top_level_folder_and_dflash_subpackage():
    layout = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1].split("```")[1]
    named = {line.split()[0] for line in layout.splitlines() if line.strip()}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {path.split("/")[0] + "/" for path in tracked if "/" in path and not path.startswith(".")}
    subpackages = {p.parent.name + "/" for p in (ROOT / "dflash").glob("*/__init__.py")}
    assert folders | {"app.py"} <= named and subpackages <= named, (folders | subpackages) - named
