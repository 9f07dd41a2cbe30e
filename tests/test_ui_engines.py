"""Which block size the sliders show for a preset: the loaded draft's, else the registry's; and the page's
preset dropdown moving the block-size and max-block sliders to the chosen preset's draft."""

from __future__ import annotations

import json

import pytest
import torch

from dflash.registry import DEFAULT_DRAFT_DIR, PRESETS, draft_block_size
from tests.ui_support import tiny_text_engine
from ui import build_demo
from ui.engines import EngineProvider
from ui.handlers import CONTROL_KEYS, Playground, defaults


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
    bare = tiny_text_engine(block_size=4)
    bare.drafter = bare.draft = None
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
    request = pg.make_request(values, engine)
    assert engine.check(request, engine.prompt_ids(request))[0] == 16
