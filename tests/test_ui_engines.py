"""Which block size the sliders show for a preset: the loaded draft's, else the registry's; the page's preset
dropdown moving the block-size and max-block sliders to the chosen preset's draft; and loading presets for
visitors: the request validated before any load, only the presets the operator offers, one load at a time within
the request's deadline and the swap interval, and a swapped-out engine freed before the next one loads."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import pytest
import torch

from dflash.decode.engine import Engine
from dflash.errors import BusyError, ModelLoadError, ValidationError
from dflash.loading.registry import DEFAULT_DRAFT_DIR, PRESETS, draft_block_size
from dflash.decode.request import Request
from tests.ui_support import tiny_text_engine
from ui import build_demo, gpu
from ui.engines import PRESETS_ENV, EngineProvider, offered_presets
from ui.handlers import CONTROL_KEYS, Playground, Settings, defaults


def never_called(name):
    raise AssertionError(f"the block size of {name} must not load it")


def test_block_size_of_presets_not_loaded_comes_from_the_registry():
    provider = EngineProvider(never_called)
    assert provider.block_size("qwen3-4b") == provider.block_size("qwen3-8b") == 16  # the z-lab -b16 drafts
    assert provider.block_size("llama3.1-8b") == 10
    config = DEFAULT_DRAFT_DIR / "config.json"
    trained = json.loads(config.read_text())["block_size"] if config.is_file() else None
    assert provider.block_size("default") == draft_block_size(PRESETS["default"]) == trained
    assert provider.block_size("not-a-preset") is None


def test_block_size_of_a_loaded_preset_is_its_drafts():
    provider = EngineProvider({"default": tiny_text_engine(block_size=4)})
    assert provider.block_size("default") == 4
    bare = tiny_text_engine(draft=False)
    assert EngineProvider({"default": bare}).block_size("default") is None  # no draft: nothing to follow


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    engines = {"default": tiny_text_engine(block_size=8), "qwen3-4b": tiny_text_engine(block_size=16, name="b16")}
    return build_demo(engines)


def on_preset_change(demo):
    """The preset dropdown's handler that updates the block sliders, and those sliders' elem_ids."""
    preset = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "preset")
    fn = next(f for f in demo.fns.values() if [c._id for c in f.inputs] == [preset._id]
              and any(getattr(c, "elem_id", None) == "block-size" for c in f.outputs))
    return fn.fn, [c.elem_id for c in fn.outputs]


def test_choosing_a_preset_moves_the_block_sliders_to_its_draft(demo):
    block = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "block-size")
    assert block.value == 8  # the first preset's draft
    handler, outputs = on_preset_change(demo)
    assert outputs == ["block-size", "max-block"]
    to_b16 = handler("qwen3-4b")
    assert [u["value"] for u in to_b16] == [16, 16]
    assert [u["value"] for u in handler("default")] == [8, 8]
    # The values the page then sends are a valid request for that preset, at its draft's trained size.
    values = dict(zip(CONTROL_KEYS, [defaults(16)[k] for k in CONTROL_KEYS]))
    values.update(prompt="Hi", preset="qwen3-4b", block_size=to_b16[0]["value"], max_block=to_b16[1]["value"])
    pg: Playground = demo.playground
    engine = pg.engines.get("qwen3-4b")
    request = pg.make_request(values)
    assert engine.check(request, engine.prompt_ids(request))[0] == 16


# -- loading presets for visitors: validated first, only the operator's presets, bounded, swapped out engines freed --

def form(**over):
    """The page's values for a short run (what a visitor sends), with `over` applied."""
    values = dict(zip(CONTROL_KEYS, [defaults(8)[k] for k in CONTROL_KEYS]))
    values.update(prompt="Hi", max_new_tokens=3)
    values.update(over)
    return values


class TinyLoader:
    """A loader of tiny engines (one per preset name) that records its calls and what was alive at each call.
    `hold`: presets whose load waits for `release` (a load in progress); `delay_s`: each load's duration."""

    def __init__(self, delay_s: float = 0.0, hold: tuple[str, ...] = ()):
        self.calls: list[str] = []
        self.models: dict[str, weakref.ref] = {}
        self.alive_at_load: dict[str, list[str]] = {}
        self.delay_s, self.hold = delay_s, hold
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, name: str):
        self.calls.append(name)
        self.alive_at_load[name] = [k for k, ref in self.models.items() if ref() is not None]
        if name in self.hold:
            self.entered.set()
            assert self.release.wait(30)
        time.sleep(self.delay_s)
        engine = tiny_text_engine(block_size=8, name=name)
        self.models[name] = weakref.ref(engine.target.model)  # the weights: what a swap must give back
        return engine, ""


def playground(provider: EngineProvider, tmp_path, **settings) -> Playground:
    torch.set_num_threads(1)
    return Playground(provider, Settings(**settings), export_root=str(tmp_path))


@pytest.mark.parametrize("over, message", [
    ({"temperature": 5.0}, "temperature: must be in [0.0, 2.0]"),
    ({"prompt": "  "}, "prompt: must be a non-empty string"),
    ({"max_new_tokens": 0}, "max_new_tokens: must be an integer in [1, 512] in the playground"),
    ({"block_size": 0}, "block_size: must be in [1, 64]"),
    ({"adaptive": "yolo"}, "adaptive: must be one of"),
    ({"top_p": float("nan")}, "top_p: must be a finite number"),
])
def test_a_bad_request_for_a_preset_not_loaded_loads_nothing(tmp_path, over, message):
    loader = TinyLoader()
    pg = playground(EngineProvider(loader), tmp_path)
    with pytest.raises(ValidationError) as info:
        list(pg.generate(form(preset="qwen3-4b", **over), [], "s"))
    assert message in str(info.value)
    assert loader.calls == [] and pg.engines.loaded("qwen3-4b") is None


def test_a_visitor_gets_only_the_presets_the_operator_offers(tmp_path):
    loader = TinyLoader()
    provider = EngineProvider(loader, offered=["qwen3-4b"])
    assert provider.presets == ["default", "qwen3-4b"]  # the default is always offered
    pg = playground(provider, tmp_path)
    with pytest.raises(ValidationError) as info:
        list(pg.generate(form(preset="qwen3-8b"), [], "s"))
    assert info.value.param == "preset"
    assert "'qwen3-8b' is not offered on this server; choose one of default, qwen3-4b" in str(info.value)
    with pytest.raises(ValidationError, match="preset: unknown preset '../x'"):
        list(pg.generate(form(preset="../x"), [], "s"))
    assert loader.calls == []
    final = list(pg.generate(form(preset="qwen3-4b"), [], "s"))[-1]
    assert "Finished (length)" in final["status"] and loader.calls == ["qwen3-4b"]


def test_the_operators_setting_of_offered_presets():
    every = list(PRESETS)
    assert offered_presets(None, cuda=True) == offered_presets("", cuda=True) == ["default"]  # unset: the default only
    assert offered_presets("all", cuda=True) == every
    assert offered_presets("all", cuda=False) == ["default", "hinted"]  # what a CPU host can run
    assert offered_presets(" qwen3-8b, llama3.1-8b ", cuda=True) == ["default", "qwen3-8b", "llama3.1-8b"]
    with pytest.raises(ValidationError, match=f"{PRESETS_ENV}: unknown preset 'qwen9'; choose from default, hinted, qwen3-4b"):
        offered_presets("qwen3-4b,qwen9", cuda=True)
    with pytest.raises(ValidationError, match=f"{PRESETS_ENV}: preset 'qwen3-8b' needs a CUDA GPU; this host has none"):
        offered_presets("qwen3-8b", cuda=False)


def test_the_registry_loader_offers_what_the_operator_set(monkeypatch):
    monkeypatch.delenv(PRESETS_ENV, raising=False)
    assert EngineProvider().presets == ["default"]
    monkeypatch.setenv(PRESETS_ENV, "all")
    assert EngineProvider().presets == (list(PRESETS) if torch.cuda.is_available() else ["default", "hinted"])


def run_deadline(final: dict) -> float:
    """The deadline the run was given: its Started event's request, from the finished run's trace."""
    return final["trace"]["replay"].trace.events[0].request["deadline_s"]


def test_a_load_counts_against_the_requests_deadline(tmp_path):
    pg = playground(EngineProvider(TinyLoader(delay_s=0.5)), tmp_path, deadline_s=30.0)
    after_load = run_deadline(list(pg.generate(form(preset="qwen3-8b"), [], "s"))[-1])
    assert 25.0 < after_load <= 29.5  # the load's half second (and more on a busy machine) came off
    assert run_deadline(list(pg.generate(form(preset="qwen3-8b"), [], "s"))[-1]) == 30.0  # loaded: the whole deadline


def test_a_load_longer_than_the_deadline_refuses_the_request_and_keeps_the_model(tmp_path):
    loader = TinyLoader(delay_s=1.0)
    pg = playground(EngineProvider(loader), tmp_path, deadline_s=0.8)
    with pytest.raises(ModelLoadError, match=r"preset: loading 'qwen3-4b' took \d+\.\d s, longer than the "
                                             r"request's deadline of 0\.8 s; it is loaded now"):
        list(pg.generate(form(preset="qwen3-4b"), [], "s"))
    assert pg.engines.loaded("qwen3-4b") is not None  # a load cannot be interrupted: it is kept for the next request
    assert run_deadline(list(pg.generate(form(preset="qwen3-4b"), [], "s"))[-1]) == 0.8
    assert loader.calls == ["qwen3-4b"]


def test_loads_are_serialised_and_a_visitor_load_is_refused_while_one_runs(tmp_path):
    loader = TinyLoader(hold=("qwen3-4b",))
    pg = playground(EngineProvider(loader), tmp_path)
    first = threading.Thread(target=lambda: list(pg.generate(form(preset="qwen3-4b"), [], "a")))
    first.start()
    try:
        assert loader.entered.wait(30)
        with pytest.raises(BusyError, match="preset: another model is being loaded on this server"):
            list(pg.generate(form(preset="qwen3-8b"), [], "b"))
    finally:
        loader.release.set()
        first.join(60)
    assert loader.calls == ["qwen3-4b"] and pg.engines.loaded("qwen3-4b") is not None


def test_a_visitor_cannot_swap_models_again_within_the_swap_interval(tmp_path):
    loader = TinyLoader()
    pg = playground(EngineProvider(loader, swap_interval_s=600.0), tmp_path)
    list(pg.generate(form(preset="qwen3-4b"), [], "a"))
    with pytest.raises(BusyError, match=r"preset: the server switched models \d+ s ago and switches at most every "
                                        r"600 s; use qwen3-4b or try again in \d+ s"):
        list(pg.generate(form(preset="qwen3-8b"), [], "b"))
    assert loader.calls == ["qwen3-4b"] and pg.engines.loaded("qwen3-4b") is not None
    list(pg.generate(form(preset="default"), [], "b"))  # the default is loaded beside it: not a swap
    assert loader.calls == ["qwen3-4b", "default"]


def test_a_swapped_out_engine_is_freed_before_the_next_load(tmp_path):
    """Generate with one large preset, then another: the first one's weights are gone (no reference kept anywhere)
    before the second loads. Automatic garbage collection is off, so the provider must free them itself."""
    loader = TinyLoader()
    pg = playground(EngineProvider(loader), tmp_path)
    gc.disable()
    try:
        for preset in ("qwen3-4b", "qwen3-8b"):
            list(pg.generate(form(preset=preset), [], "s"))
        assert loader.alive_at_load["qwen3-8b"] == []
        assert loader.models["qwen3-4b"]() is None and loader.models["qwen3-8b"]() is not None
    finally:
        gc.enable()


def test_a_swap_in_the_gpu_workers_provider_frees_the_old_engine():
    """The ZeroGPU worker resolves (provider number, preset) through the same provider: a swap there frees too."""
    loader = TinyLoader()
    provider = EngineProvider(loader)
    key = gpu.register(provider)
    request = Request(prompt="Hi", max_new_tokens=3)
    gc.disable()
    try:
        for preset in ("qwen3-4b", "llama3.1-8b"):
            assert gpu.record((key, preset), request)[-1].reason == "length"
        assert loader.alive_at_load["llama3.1-8b"] == [] and loader.models["qwen3-4b"]() is None
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_swap_gives_the_old_engines_cuda_memory_back():
    """On CUDA the swapped-out weights leave the allocator's cache too (torch.cuda.empty_cache after the drop)."""
    from dflash.models.target import Target
    from tests.conftest import tiny_draft, tiny_target

    def loader(name: str):
        cpu = tiny_target("llama", layers=8)
        target = Target(cpu.model, None, name=name, device=torch.device("cuda"))
        return Engine(target, tiny_draft(target), name=name), ""

    provider = EngineProvider(loader)
    provider.get("qwen3-4b")
    one = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    provider.get("qwen3-8b")
    two = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert two[0] <= one[0] and two[1] <= one[1]  # one large model's worth, not two


@pytest.mark.parametrize("setting,message", [({PRESETS_ENV: "default,qwen9"}, f"{PRESETS_ENV}: unknown preset 'qwen9'"),
                                             ({"DFLASH_THREADS": "abc"}, "DFLASH_THREADS: must be a whole number")])
def test_the_playground_refuses_a_bad_setting_at_start_in_one_line(setting, message, monkeypatch):
    """`python app.py` with a bad DFLASH_PRESETS or DFLASH_THREADS stops before loading anything, naming the
    variable: its `main(argv)` in this process (tests/test_ui_serve.py starts app.py itself for such a setting)."""
    from tests.test_ui_serve import free_port  # 7860 may be taken here: the port is checked first
    from ui.serve import main

    for name, value in {**setting, "DFLASH_AUTO_INSTALL": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SPACE_ID", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["--port", str(free_port())])
    assert str(stopped.value.code).startswith(f"dflash-playground: {message}")  # Python prints it, exit status 1


def test_over_http_a_visitor_cannot_load_a_model_with_a_bad_request_or_an_unoffered_preset(tmp_path):
    """The launched playground (gradio_client), engines loaded on first use by a loader of tiny engines."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from tests.test_app_api import args, named
    from ui import launch_kwargs

    torch.set_num_threads(1)
    loader = TinyLoader()
    demo = build_demo(EngineProvider(loader, offered=["qwen3-4b"]))
    _, url, _ = demo.launch(**launch_kwargs(server_port=None, prevent_thread_lock=True, quiet=True))
    client = Client(url, verbose=False, download_files=str(tmp_path))
    try:
        for over, message in (({"preset": "qwen3-4b", "temperature": 5.0}, "Temperature: must be in [0.0, 2.0]"),
                              ({"preset": "qwen3-8b"}, "Model preset: 'qwen3-8b' is not offered on this server")):
            with pytest.raises(AppError) as info:
                client.predict(*args(**over), api_name="/generate")
            assert message in str(info.value)
        assert loader.calls == []
        final = named(client.predict(*args(preset="qwen3-4b", max_new_tokens=4), api_name="/generate"))
        assert "Finished (length)" in final["status"] and loader.calls == ["qwen3-4b"]
    finally:
        client.close()
        demo.close()
