"""dflash.loading.zerogpu: the ZeroGPU decorator; and the playground on ZeroGPU (ui/gpu.py), through its HTTP API, with the
`spaces` package emulated by a forked worker. The --no-deps install of the GGUF package: test_ui_space_setup.py."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import types
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from dflash.loading import zerogpu
from dflash.decode.request import Request
from tests.test_app_api import CLIENT_HISTORY_TOKENS, args, named
from tests.ui_support import tiny_text_engine
from ui import build_demo, gpu, launch_kwargs
from ui.replay import parse_trace


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
    assert zerogpu.duration_for(0) == 15 and zerogpu.duration_for(400) == 35 and zerogpu.duration_for(10**6) == 120


# -- the playground on ZeroGPU, through its HTTP API -------------------------------------------------------------
class ForkedSpaces:
    """Stands in for the `spaces` package on ZeroGPU hardware, as far as an app can tell: `GPU(duration=...)(fn)`
    runs `fn` in a worker process forked from this one at the first call and reused after (so the worker holds
    this process's state as of that first call), arguments and results cross a pipe pickled, and an exception
    other than gr.Error comes back as a generic "ZeroGPU worker error" that names only its class."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []  # (function, seconds asked for), recorded in this process
        self.workers: list = []
        self._lock = threading.Lock()

    def GPU(self, duration=60, **kwargs):  # the package's name
        def decorate(fn):
            worker: dict = {}

            def on_gpu(*args, **kw):
                with self._lock:  # one GPU: one task at a time
                    self.calls.append((fn.__name__, duration(*args, **kw) if callable(duration) else duration))
                    if not worker:
                        worker.update(self._fork(fn))
                    worker["conn"].send((args, kw))
                    ok, value, title = worker["conn"].recv()
                if ok:
                    return value
                raise gr.Error(value, title=title, print_exception=False)

            return on_gpu

        return decorate

    def _fork(self, fn) -> dict:
        ctx = multiprocessing.get_context("fork")
        conn, child = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(fn, child), daemon=True)
        process.start()
        self.workers.append((process, conn))
        return {"conn": conn}

    def close(self):
        for process, conn in self.workers:
            conn.send(None)  # the worker returns
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def _serve(fn, conn):
    while True:
        task = conn.recv()
        if task is None:
            return
        args, kw = task
        try:
            conn.send((True, fn(*args, **kw), ""))
        except gr.Error as exc:
            conn.send((False, exc.message, exc.title))
        except Exception as exc:  # noqa: BLE001 — what ZeroGPU passes on: the class name only
            conn.send((False, repr(type(exc).__name__), "ZeroGPU worker error"))


SEEDS = {"default": 0, "qwen3-4b": 5}


def build_tiny(name: str):
    """The loader: the same tiny engine for a preset wherever it runs (here, or in the GPU worker)."""
    return tiny_text_engine(block_size=8, seed=SEEDS[name], name=name), ""


@pytest.fixture(scope="module")
def zerogpu_app(tmp_path_factory):
    """The playground on (emulated) ZeroGPU: the real GPU function of ui/gpu.py decorated by
    dflash.loading.zerogpu.gpu_decorator on a Space, engines loaded on first use by a loader."""
    spaces = ForkedSpaces()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPACE_ID", "someone/dflash-playground")
        mp.setenv("SPACES_ZERO_GPU", "true")
        mp.setitem(sys.modules, "spaces", spaces)
        mp.setattr(gpu, "record_on_gpu", zerogpu.gpu_decorator(duration=gpu.gpu_seconds)(gpu.record))
        demo = build_demo(build_tiny)
        _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
        client = Client(url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))
        try:
            yield types.SimpleNamespace(demo=demo, client=client, spaces=spaces)
        finally:
            client.close()
            demo.close()
            spaces.close()


def test_generate_and_compare_on_zerogpu_end_with_the_run(zerogpu_app):
    """The run is recorded in the GPU worker and animated here: the last frame, trace and exports arrive."""
    app = zerogpu_app
    calls = len(app.spaces.calls)
    final = named(app.client.predict(*args(max_new_tokens=24), api_name="/generate"))
    assert "Finished (length)" in final["status"] and "24 tokens" in final["status"]
    assert app.spaces.calls[calls:] == [("record", zerogpu.duration_for(24))]
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    engine = app.demo.playground.engines.loaded("default")
    assert trace.events[-1].output_ids == engine.generate(Request(**trace.events[0].request)).output_ids
    assert final["history_table"]["data"][-1][CLIENT_HISTORY_TOKENS] == 24
    compared = named(app.client.predict(False, api_name="/compare"))
    assert "Compared with autoregressive" in compared["status"] and "outputs ✓ identical" in compared["status"]
    assert len(app.spaces.calls) == calls + 2 and len(app.spaces.workers) == 1  # one worker, reused


def test_a_preset_loaded_after_the_worker_started_runs_in_it(zerogpu_app):
    """The worker was forked before this preset was loaded here; it loads the preset itself."""
    app = zerogpu_app
    app.client.predict(*args(max_new_tokens=4), api_name="/generate")  # the worker exists from here on
    assert app.demo.playground.engines.loaded("qwen3-4b") is None
    final = named(app.client.predict(*args(preset="qwen3-4b", max_new_tokens=16), api_name="/generate"))
    assert "Finished (length)" in final["status"]
    trace = parse_trace(Path(final["export_trace"]).read_text(encoding="utf-8"))
    here = app.demo.playground.engines.loaded("qwen3-4b")
    assert trace.events[0].model == "qwen3-4b"
    assert trace.events[-1].output_ids == here.generate(Request(**trace.events[0].request)).output_ids
    assert len(app.spaces.workers) == 1


@pytest.mark.parametrize("over, message", [
    ({"block_size": 12}, "Block size: must be in [2, 8]"),  # against the draft: checked by the engine
    ({"max_new_tokens": 500}, "exceeds the context budget 512"),
])
def test_bad_values_are_refused_by_name_before_the_gpu_is_asked_for(zerogpu_app, over, message):
    calls = len(zerogpu_app.spaces.calls)
    with pytest.raises(AppError) as info:
        zerogpu_app.client.predict(*args(**over), api_name="/generate")
    assert message in str(info.value) and "ZeroGPU worker error" not in str(info.value)
    assert len(zerogpu_app.spaces.calls) == calls  # no GPU time spent
