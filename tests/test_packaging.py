"""The package works installed, not only from the checkout: a wheel built from pyproject.toml claims only the
project's own import names (`dflash`, `dflash_playground`), installed into an empty directory it imports, finds the
shipped draft, traces and CSS, and its console scripts run."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
import dflash, dflash.kernels, dflash_playground
from dflash.loading.registry import ASSETS, DEFAULT_DRAFT_DIR
from dflash.models.draft import load_draft
from dflash_playground.layout import CSS_PATH
from dflash_playground.replay import bundled_traces
for mod in (dflash, dflash.kernels, dflash_playground):
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
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n and ".data/" not in n}
    assert top == {"dflash", "dflash_playground"}, top  # not `ui`, `kernels` (Hugging Face's name) or `assets`
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "dflash").rglob("*.py") if "__pycache__" not in p.parts}
    assert shipped <= set(names), shipped - set(names)  # a new subpackage of dflash/ must be listed in pyproject.toml
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy only: the checkout is not on the path
    run = subprocess.run([sys.executable, "-c", CHECK, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "installed ok" in run.stdout, run.stderr[-2000:]
    for script, expect in (("dflash", "generate"), ("dflash-playground", "--port")):
        cli = subprocess.run([str(site / "bin" / script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert cli.returncode == 0 and expect in cli.stdout, (script, cli.stderr[-2000:])


def test_the_playground_imports_its_own_modules_relatively():
    """ui/ is installed as `dflash_playground`: an absolute `ui.` import would fail there (and nowhere in the checkout)."""
    absolute = [f"{path.name}:{node.lineno}" for path in sorted((ROOT / "ui").glob("*.py"))
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ui"
                or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ui" for a in node.names)]
    assert not absolute, f"import ui's modules relatively (from . import x / from .x import y): {absolute}"
