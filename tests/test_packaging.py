"""The package works installed, not only from the checkout: a wheel built from pyproject.toml, installed into an
empty directory, imports, finds the shipped draft, traces and CSS, and its console scripts run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
import dflash, kernels, ui
from dflash.registry import ASSETS, DEFAULT_DRAFT_DIR
from dflash.draft import load_draft
from ui.layout import CSS_PATH
from ui.replay import bundled_traces
for mod in (dflash, kernels, ui):
    assert Path(mod.__file__).resolve().is_relative_to(site), mod.__file__
assert ASSETS.resolve().is_relative_to(site), ASSETS
draft, vocab = load_draft(DEFAULT_DRAFT_DIR)
assert draft.config.num_hidden_layers >= 1 and vocab is not None
assert CSS_PATH.is_file() and bundled_traces(), (CSS_PATH, bundled_traces())
print("installed ok")
"""


def test_the_wheel_works_without_the_checkout(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True,
                   cwd=tmp_path)
    (wheel,) = wheels.glob("dflash_playground-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy only: the checkout is not on the path
    run = subprocess.run([sys.executable, "-c", CHECK, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "installed ok" in run.stdout, run.stderr[-2000:]
    cli = subprocess.run([str(site / "bin" / "dflash"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert cli.returncode == 0 and "generate" in cli.stdout, cli.stderr[-2000:]
    assert (site / "bin" / "dflash-playground").is_file()
