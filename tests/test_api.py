"""The seed article's API (`DFlashConfig`, `DFlashModel`) on the real default target with a random draft."""

import pytest

from dflash import DFlashConfig, DFlashModel, Engine, ValidationError
from dflash.models.draft import save_draft
from dflash.models.target import Target
from tests.engine_helpers import random_default_draft


def test_config_validates_like_the_request():
    with pytest.raises(ValidationError, match="acceptance_threshold"):
        DFlashConfig(acceptance_threshold=1.5)
    with pytest.raises(ValidationError, match="adaptive"):
        DFlashConfig(adaptive="tcp")
    with pytest.raises(ValidationError, match="lookup_ngram"):
        DFlashConfig(lookup_ngram=-1)
    assert DFlashConfig(lookup_ngram=2).request(prompt="x").lookup_ngram == 2
    with pytest.raises(ValidationError, match="trace_attention"):
        DFlashConfig(trace_attention="no")
    assert DFlashConfig(block_size=8, max_block_size=32).policy() == "slow-start"
    assert DFlashConfig(block_size=8).policy() == "auto"  # the engine's default: cost on a CPU, fixed on a GPU


@pytest.mark.slow
def test_article_api_on_the_default_target(tmp_path, real_model):
    import copy

    model, tokenizer = copy.deepcopy(real_model[0]), real_model[1]  # the session's load (conftest); the API hooks its copy
    draft = random_default_draft(Target(model, tokenizer), block_size=8)
    save_draft(draft, tmp_path / "draft")
    exact = DFlashModel(DFlashConfig(draft_model_name=str(tmp_path / "draft"), block_size=4, max_block_size=8,
                                     diffusion_steps=2), model, tokenizer)
    text = exact.generate("What is 2 + 2?", max_new_tokens=12)
    assert isinstance(text, str) and text
    assert not exact.last_result.stats["lossy"]
    baseline = exact.engine.generate(exact.config.request(prompt="What is 2 + 2?", max_new_tokens=12, use_draft=False))
    assert exact.last_result.output_ids == baseline.output_ids  # threshold 1.0: lossless
    lossy = DFlashModel(DFlashConfig(draft_model_name=str(tmp_path / "draft"), acceptance_threshold=0.9), exact.engine)
    lossy.generate("What is 2 + 2?", max_new_tokens=12, temperature=0.7, top_p=0.9)
    assert lossy.last_result.stats["lossy"]
    assert isinstance(lossy.engine, Engine)


def test_options_given_per_call_override_the_config(engine):
    """generate(..., block_size=2, lookup_ngram=1) on a model whose config sets both: the call's values win (before,
    a TypeError about a keyword given twice); an unknown option is a ValidationError naming it."""
    model = DFlashModel(DFlashConfig(block_size=4, lookup_ngram=2), engine)
    model.generate("", prompt_ids=(5, 6, 7, 5, 6), max_new_tokens=6, block_size=2, lookup_ngram=1)
    request = model.last_result.events[0].request
    assert request["block_size"] == 2 and request["lookup_ngram"] == 1
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4)
    assert model.last_result.events[0].request["block_size"] == 4  # the config's again
    with pytest.raises(ValidationError, match="block_sise"):
        model.generate("x", block_sise=2)


def test_a_config_that_traces_attention_records_it_at_every_draft_step(engine):
    model = DFlashModel(DFlashConfig(block_size=4, lookup_ngram=0, trace_attention=True), engine)
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=6)
    steps = [e for e in model.last_result.events if type(e).__name__ == "DraftStep"]
    assert steps and all(s.attention for s in steps)
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=6, trace_attention=False)  # a call's value wins
    assert not any(e.attention for e in model.last_result.events if type(e).__name__ == "DraftStep")


def test_bad_model_arguments_name_the_parameter(engine):
    """Before: AttributeErrors ('dict' object has no attribute 'draft_model_name', 'int' has no 'config')."""
    with pytest.raises(ValidationError) as err:
        DFlashModel({"block_size": 4}, engine)
    assert err.value.param == "config"
    with pytest.raises(ValidationError) as err:
        DFlashModel(DFlashConfig(), 123)
    assert err.value.param == "target"
    assert DFlashModel(DFlashConfig(), engine).last_result is None  # before the first generate: None, not an AttributeError


def test_a_misspelt_preset_is_named_at_once_with_the_presets():
    """It went to the hub as a model id and failed ~20 s of retries later, naming no preset."""
    with pytest.raises(ValidationError, match=r"target: unknown preset or model 'defualt': a preset \(default, "):
        DFlashModel(DFlashConfig(), "defualt")  # refused before any hub lookup


def test_stop_from_another_thread(engine):
    """stream/generate take a cancel Event, as Engine.stream does: set from another thread, the run stops after the
    current block and keeps what it committed (before: 'cancel: is not a generation option')."""
    import threading

    model = DFlashModel(DFlashConfig(block_size=2), engine)
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=40)
    assert len(model.last_result.output_ids) == 40
    cancel = threading.Event()
    events = []
    for event in model.stream("", prompt_ids=(5, 6, 7), max_new_tokens=40, cancel=cancel):
        events.append(event)
        if type(event).__name__ == "Commit" and event.block == 2:
            stopper = threading.Thread(target=cancel.set)
            stopper.start()
            stopper.join()
    fin = events[-1]
    assert fin.reason == "cancelled" and 0 < len(fin.output_ids) < 40
    assert fin.output_ids == model.last_result.output_ids[: len(fin.output_ids)]
    cancel.set()  # already set: nothing runs, not even the prefill
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=40, cancel=cancel)
    assert model.last_result.finish_reason == "cancelled" and model.last_result.output_ids == []


def test_stream_and_generate_share_their_defaults(engine):
    """model.stream(prompt) runs what model.generate(prompt) runs (before, stream took the Request's 128 new tokens
    where generate takes 512)."""
    model = DFlashModel(DFlashConfig(block_size=2), engine)
    for call in (model.stream, model.generate):  # 512 new tokens do not fit this tiny target's context: both say so
        with pytest.raises(ValidationError, match=r"max_new_tokens \(512\)"):
            call("", prompt_ids=(5, 6, 7))
    streamed = list(model.stream("", prompt_ids=(5, 6, 7), max_new_tokens=24))[-1]
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=24)
    assert streamed.output_ids == model.last_result.output_ids


def test_two_threads_each_see_their_own_last_result(engine):
    """Two threads share one model: each one reads its own call's last_result (before: whichever call finished last,
    so a thread could read another's statistics)."""
    import threading

    model = DFlashModel(DFlashConfig(block_size=4), engine)
    first_done, second_done, seen = threading.Event(), threading.Event(), {}

    def first():
        model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=3)
        first_done.set()
        second_done.wait(30)  # read only after the other thread's call has finished
        seen["first"] = len(model.last_result.output_ids)

    thread = threading.Thread(target=first)
    thread.start()
    first_done.wait(30)
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=9)
    second_done.set()
    thread.join(30)
    assert seen == {"first": 3}
    assert len(model.last_result.output_ids) == 9


def test_a_per_call_max_block_size_picks_the_policy_as_in_the_config(engine):
    """adaptive=None means slow-start when max_block_size > block_size: the same whether max_block_size is in the
    config or given per call (before: per call it kept the config's 'auto')."""
    in_config = DFlashModel(DFlashConfig(block_size=2, max_block_size=8), engine)
    in_config.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4)
    per_call = DFlashModel(DFlashConfig(block_size=2), engine)
    per_call.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4, max_block_size=8)
    assert in_config.last_result.events[0].request["adaptive"] == "slow-start"
    assert per_call.last_result.events[0].request["adaptive"] == "slow-start"
    per_call.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4, block_size=8, max_block_size=8, adaptive="fixed")
    assert per_call.last_result.events[0].request["adaptive"] == "fixed"


@pytest.mark.parametrize("kw,param", [
    (dict(dtype="float64"), "dtype"),  # before: accepted; the load failed later with a ModelLoadError
    (dict(dtype=5), "dtype"),
    (dict(device="gpu"), "device"),
    (dict(device=5), "device"),
    (dict(draft_model_name=5), "draft_model_name"),  # before: a TypeError after the target had loaded
    (dict(draft_model_name=None), "draft_model_name"),  # before: silently the default draft
    (dict(draft_model_name=""), "draft_model_name"),
    (dict(draft_model_name="/no/such/draft"), "draft_model_name"),
])
def test_bad_load_options_fail_at_construction(kw, param):
    with pytest.raises(ValidationError) as err:
        DFlashConfig(**kw)
    assert err.value.param == param


def test_good_load_options_are_accepted():
    for kw in (dict(dtype="float32"), dict(dtype="bfloat16"), dict(dtype="auto"), dict(dtype=None), dict(device="cpu"),
               dict(device=None), dict(draft_model_name="default"), dict(draft_model_name="z-lab/Qwen3-4B-DFlash-b16")):
        DFlashConfig(**kw)
    with pytest.raises(ValidationError, match="use_draft=False"):  # None says how to run without a draft
        DFlashConfig(draft_model_name=None)


def test_a_model_on_an_engine_refuses_load_options_it_would_ignore(engine):
    """DFlashModel(config, engine) runs the engine as it is: before, config.dtype / device / draft_model_name that
    disagreed with it were silently ignored. Options the engine matches, and the defaults, are accepted."""
    import torch

    DFlashModel(DFlashConfig(dtype="float32", device="cpu"), engine)  # this engine's own: accepted
    conflicts = [(dict(dtype="bfloat16"), "dtype"), (dict(draft_model_name="z-lab/Qwen3-4B-DFlash-b16"), "draft_model_name")]
    if torch.cuda.is_available():
        conflicts.append((dict(device="cuda"), "device"))
    for kw, param in conflicts:
        with pytest.raises(ValidationError) as err:
            DFlashModel(DFlashConfig(**kw), engine)
        assert err.value.param == param


@pytest.mark.slow
def test_an_engine_from_load_engine_accepts_its_own_draft_however_the_directory_is_written(monkeypatch, tmp_path):
    """load_engine did not record where its draft came from, so naming that same draft (by a relative path) was
    refused as another one."""
    import os

    from dflash.loading.load import load_engine

    monkeypatch.setenv("DFLASH_PROBE", "0")
    engine, info = load_engine("default", dtype="float32")
    for name in (os.path.relpath(info["draft"]), info["draft"] + "/", "default"):
        DFlashModel(DFlashConfig(draft_model_name=name), engine)
    other = tmp_path / "other-draft"  # another draft directory: refused
    save_draft(random_default_draft(engine.target, block_size=4), other)
    with pytest.raises(ValidationError, match="runs the draft it was built with"):
        DFlashModel(DFlashConfig(draft_model_name=str(other)), engine)


def test_adaptive_none_per_call_means_what_it_means_in_the_config(engine):
    """Before: generate(..., adaptive=None) was a ValidationError though the config documents None."""
    model = DFlashModel(DFlashConfig(block_size=2, max_block_size=8, adaptive="fixed"), engine)
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4, adaptive=None)
    assert model.last_result.events[0].request["adaptive"] == "slow-start"  # None: slow-start as max > block
    model.generate("", prompt_ids=(5, 6, 7), max_new_tokens=4)
    assert model.last_result.events[0].request["adaptive"] == "fixed"  # not given: the config's
