"""Request validation: every bad value raises a ValidationError that
names the parameter and states the allowed range; boundary values are accepted; the context budget is checked
against the loaded models before anything runs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.errors import ValidationError
from dflash.decode.request import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_PROMPT_TOKENS, MAX_SEED, Request

NAN, INF = float("nan"), float("inf")
OK = dict(prompt_ids=(1, 2, 3))

BAD = [
    # (field, value, words the message must contain)
    ("prompt", "", ["non-empty"]),
    ("prompt", "   \n\t", ["non-empty"]),
    ("prompt", None, ["non-empty"]),
    ("prompt", 42, ["non-empty"]),
    ("prompt", "x" * (MAX_PROMPT_CHARS + 1), [str(MAX_PROMPT_CHARS)]),
    ("prompt_ids", (), ["non-empty"]),
    ("prompt_ids", "1,2,3", ["sequence"]),
    ("prompt_ids", (1, -2), ["non-negative"]),
    ("prompt_ids", (1, 2.0), ["integer"]),
    ("prompt_ids", (True,), ["integer"]),
    ("prompt_ids", tuple(range(MAX_PROMPT_TOKENS + 1)), [str(MAX_PROMPT_TOKENS)]),
    ("max_new_tokens", 0, ["[1, 4096]"]),
    ("max_new_tokens", -1, ["[1, 4096]"]),
    ("max_new_tokens", MAX_NEW_TOKENS + 1, ["[1, 4096]"]),
    ("max_new_tokens", 1.5, ["integer"]),
    ("max_new_tokens", "10", ["integer"]),
    ("max_new_tokens", True, ["integer"]),
    ("max_new_tokens", NAN, ["integer"]),
    ("temperature", -0.1, ["[0.0, 2.0]"]),
    ("temperature", 2.01, ["[0.0, 2.0]"]),
    ("temperature", NAN, ["finite"]),
    ("temperature", INF, ["finite"]),
    ("temperature", -INF, ["finite"]),
    ("temperature", "0.5", ["number"]),
    ("top_p", 0.0, ["(0.0, 1.0]"]),
    ("top_p", 1.01, ["(0.0, 1.0]"]),
    ("top_p", NAN, ["finite"]),
    ("top_p", -0.5, ["(0.0, 1.0]"]),
    ("top_k", -1, ["[0,"]),
    ("top_k", 2.5, ["integer"]),
    ("top_k", NAN, ["integer"]),
    ("seed", -1, ["[0,"]),
    ("seed", MAX_SEED + 1, [str(MAX_SEED)]),
    ("seed", 1.0, ["integer"]),
    ("block_size", 0, ["[1, 64]"]),
    ("block_size", 65, ["[1, 64]"]),
    ("block_size", 4.0, ["integer"]),
    ("diffusion_steps", 0, ["[1, 16]"]),
    ("diffusion_steps", 17, ["[1, 16]"]),
    ("diffusion_steps", NAN, ["integer"]),
    ("confidence_threshold", 0.0, ["(0.0, 1.0]"]),
    ("confidence_threshold", 1.5, ["(0.0, 1.0]"]),
    ("confidence_threshold", NAN, ["finite"]),
    ("acceptance_threshold", 0.0, ["(0.0, 1.0]"]),
    ("acceptance_threshold", 1.0000001, ["(0.0, 1.0]"]),
    ("acceptance_threshold", INF, ["finite"]),
    ("adaptive", "tcp", ["auto", "fixed", "slow-start", "cost"]),
    ("adaptive", None, ["auto", "fixed"]),
    ("min_block_size", 0, ["[1, 64]"]),
    ("min_block_size", 65, ["[1, 64]"]),
    ("max_block_size", 0, ["[1, 64]"]),
    ("max_block_size", 99, ["[1, 64]"]),
    ("verify", "greedy", ["match", "rejection"]),
    ("deadline_s", 0.0, ["(0.0,"]),
    ("deadline_s", -5, ["(0.0,"]),
    ("deadline_s", NAN, ["finite"]),
    ("deadline_s", INF, ["finite"]),
    ("stop_ids", (1, -1), ["non-negative"]),
    ("stop_ids", (1.5,), ["non-negative"]),
    ("stop_ids", 5, ["sequence"]),
    ("use_draft", "no", ["true or false"]),
    ("chat_template", 1, ["true or false"]),
]


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{f}={str(v)[:12]}" for f, v, _ in BAD])
def test_bad_values_name_the_parameter(field, value, words):
    kw = dict(OK)
    if field == "prompt":
        kw = {"prompt": value}
    kw[field] = value
    with pytest.raises(ValidationError) as err:
        Request(**kw)
    assert err.value.param == field
    msg = str(err.value)
    assert msg.startswith(f"{field}:")
    for w in words:
        assert w in msg, (msg, w)
    assert isinstance(err.value, ValueError)


GOOD = [
    ("prompt", "x"),
    ("prompt", "x" * MAX_PROMPT_CHARS),
    ("prompt_ids", (0,)),
    ("prompt_ids", [5, 6]),  # a list is accepted and stored as a tuple
    ("max_new_tokens", 1),
    ("max_new_tokens", MAX_NEW_TOKENS),
    ("temperature", 0),
    ("temperature", 0.0),
    ("temperature", 2.0),
    ("top_p", 1.0),
    ("top_p", 1e-9),
    ("top_k", 0),
    ("seed", 0),
    ("seed", MAX_SEED),
    ("block_size", 1),
    ("block_size", 64),
    ("block_size", None),
    ("diffusion_steps", 1),
    ("diffusion_steps", 16),
    ("confidence_threshold", 1.0),
    ("confidence_threshold", 1e-6),
    ("acceptance_threshold", 1.0),
    ("acceptance_threshold", 0.01),
    ("adaptive", "cost"),
    ("adaptive", "auto"),
    ("min_block_size", 1),
    ("max_block_size", 64),
    ("verify", "rejection"),
    ("deadline_s", None),
    ("deadline_s", 86_400),
    ("stop_ids", (0, 7)),
    ("stop_ids", [3]),
    ("use_draft", False),
    ("chat_template", False),
]


@pytest.mark.parametrize("field,value", GOOD, ids=[f"{f}={str(v)[:12]}" for f, v in GOOD])
def test_boundary_values_are_accepted(field, value):
    kw = {"prompt": value} if field == "prompt" else dict(OK, **{field: value})
    req = Request(**kw)
    if field == "prompt_ids":
        assert req.prompt_ids == tuple(value)
    elif field == "stop_ids":
        assert req.stop_ids == tuple(value)
    elif field != "prompt":
        assert getattr(req, field) == value


def test_cross_field_rules():
    with pytest.raises(ValidationError) as err:
        Request(**OK, min_block_size=8, max_block_size=4)
    assert err.value.param == "max_block_size" and "8" in str(err.value)
    with pytest.raises(ValidationError) as err:
        Request(**OK, verify="rejection", diffusion_steps=2, temperature=1.0)
    assert err.value.param == "diffusion_steps"
    with pytest.raises(ValidationError) as err:
        Request(**OK, verify="rejection", acceptance_threshold=0.9, temperature=1.0)
    assert err.value.param == "acceptance_threshold"
    assert Request(**OK, min_block_size=4, max_block_size=4).max_block_size == 4


def test_request_is_frozen_and_round_trips_to_dict():
    req = Request(prompt_ids=[1, 2], stop_ids=[3], temperature=0.5, seed=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.temperature = 1.0  # type: ignore[misc]
    d = req.to_dict()
    assert d["prompt_ids"] == [1, 2] and d["stop_ids"] == [3]
    assert Request(**{**d, "prompt_ids": tuple(d["prompt_ids"]), "stop_ids": tuple(d["stop_ids"])}) == req
    assert not req.lossy and Request(**OK, acceptance_threshold=0.5).lossy
    assert not any(isinstance(v, float) and math.isnan(v) for v in d.values())


# --- Checks that depend on the loaded models (Engine.stream raises before any work) --------------------------


@pytest.fixture(scope="module")
def engine():
    target = tiny_target("llama")  # max_position_embeddings 512, vocab 256, no tokenizer
    return Engine(target, tiny_draft(target, block_size=16))


def test_context_budget(engine):
    budget = engine.target.max_positions
    prompt = tuple(range(1, 11))
    ok = Request(prompt_ids=prompt, max_new_tokens=budget - 10 - 16)
    assert engine.check(ok, list(prompt)) == (16, 2, 16)
    too_long = Request(prompt_ids=prompt, max_new_tokens=budget - 10 - 16 + 1)
    with pytest.raises(ValidationError) as err:
        engine.stream(too_long)
    msg = str(err.value)
    assert err.value.param == "max_new_tokens"
    for number in ("10", str(budget - 25), "16", str(budget)):
        assert number in msg
    assert not engine._lock.locked()
    # The no-draft baseline needs only one extra position.
    assert engine.check(Request(prompt_ids=prompt, max_new_tokens=budget - 11, use_draft=False), list(prompt)) == (1, 1, 1)


@pytest.mark.parametrize("kw,param", [
    (dict(prompt_ids=(1, 256)), "prompt_ids"),  # >= vocab size
    (dict(prompt_ids=(1,), top_k=257), "top_k"),
    (dict(prompt_ids=(1,), block_size=17), "block_size"),  # above the draft's trained size
    (dict(prompt_ids=(1,), block_size=12, max_block_size=8, adaptive="slow-start"), "block_size"),
    (dict(prompt="hello"), "prompt"),  # this tiny target has no tokenizer
])
def test_model_dependent_limits(engine, kw, param):
    with pytest.raises(ValidationError) as err:
        engine.stream(Request(**kw))
    assert err.value.param == param
    assert not engine._lock.locked()


def test_a_block_above_the_trained_size_says_how_to_allow_it(engine):
    """It said "must be in [2, 16] (min/max block size)" to a caller who had set neither (and a block of 1 is fine)."""
    with pytest.raises(ValidationError, match=r"block_size: must be at most the draft's trained block size, 16, unless "
                                              r"max_block_size allows more \(its drafts past 16 are untrained\), got 17"):
        engine.stream(Request(prompt_ids=(1,), block_size=17))
    assert engine.check(Request(prompt_ids=(1,), block_size=17, max_block_size=17), [1]) == (17, 2, 17)


def test_model_dependent_boundaries_accepted(engine):
    assert engine.check(Request(prompt_ids=(255,), top_k=256), [255])[0] == 16
    assert engine.check(Request(prompt_ids=(1,), block_size=16), [1]) == (16, 2, 16)
    assert engine.check(Request(prompt_ids=(1,), block_size=1), [1]) == (1, 1, 16)
    assert engine.check(Request(prompt_ids=(1,), max_block_size=8), [1]) == (8, 2, 8)


def test_no_draft_engine_refuses_use_draft():
    target = tiny_target("llama")
    bare = Engine(target)
    with pytest.raises(ValidationError) as err:
        bare.stream(Request(prompt_ids=(1, 2)))
    assert err.value.param == "use_draft" and "use_draft=False" in str(err.value)  # it says how to run here
    assert bare.generate(Request(prompt_ids=(1, 2), max_new_tokens=2, use_draft=False)).finish_reason == "length"


def test_a_text_prompt_has_the_same_token_limit_as_prompt_ids():
    from tests.ui_support import tiny_text_engine  # a character tokenizer: one token per character

    engine = tiny_text_engine()
    with pytest.raises(ValidationError) as err:
        engine.stream(Request(prompt="a" * (MAX_PROMPT_TOKENS + 1)))
    assert err.value.param == "prompt"
    assert f"is {MAX_PROMPT_TOKENS + 1} tokens; the limit is {MAX_PROMPT_TOKENS}" in str(err.value)
    with pytest.raises(ValidationError) as err:  # at the limit it passes, then leaves no room in this model's context
        engine.stream(Request(prompt="a" * MAX_PROMPT_TOKENS))
    assert err.value.param == "prompt" and "context budget" in str(err.value)
    assert not engine._lock.locked()


@pytest.mark.parametrize("call,param", [
    (lambda e: e.stream("hello"), "request"),  # a prompt string where a Request belongs
    (lambda e: e.stream({"prompt_ids": (1, 2)}), "request"),
    (lambda e: e.generate(None), "request"),
    (lambda e: e.stream(Request(prompt_ids=(1, 2), max_new_tokens=2), cancel=True), "cancel"),  # not an Event
])
def test_engine_arguments_of_the_wrong_type_name_the_parameter(engine, call, param):
    """Before: an AttributeError from deep inside (or, for cancel, a run that ended in 'generation failed')."""
    with pytest.raises(ValidationError) as err:
        call(engine)
    assert err.value.param == param
    assert not engine._lock.locked()


def test_a_prompt_that_tokenizes_to_nothing_is_refused(tmp_path):
    """A tokenizer without a vocabulary (transformers builds one for a Qwen3 directory without tokenizer files)
    turns every prompt into no tokens: a ValidationError naming the prompt (before: the run started and ended in
    'generation failed (TypeError)')."""
    from transformers import AutoTokenizer

    from dflash.models.target import Target

    target = tiny_target("qwen3")
    target.model.config.save_pretrained(tmp_path)
    empty = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    engine = Engine(Target(target.model, empty), tiny_draft(target))
    with pytest.raises(ValidationError) as err:
        engine.stream(Request(prompt="hello"))
    assert err.value.param == "prompt" and "no tokens" in str(err.value)
    assert not engine._lock.locked()


# --- Review fixes: tiny temperatures, contradictory block sizes, numpy ids, prompt vs prompt_ids, the prompt's room --


@pytest.mark.parametrize("t", [1e-38, 1e-6, 9.99e-6])
def test_a_temperature_below_the_greedy_bound_is_stored_as_greedy(t):
    """Below 1e-5 (vLLM's bound) a temperature means greedy: logits / 1e-38 overflow float32 (inf, then NaN)."""
    req = Request(**OK, temperature=t)
    assert req.temperature == 0.0 and req.to_dict()["temperature"] == 0.0
    assert Request(**OK, temperature=1e-5).temperature == 1e-5  # the bound itself samples


@pytest.mark.parametrize("kw", [dict(), dict(use_draft=False), dict(verify="rejection")], ids=["match", "no-draft", "rejection"])
def test_tiny_temperatures_give_the_greedy_output(engine, kw):
    """Before: T=1e-38 gave garbage ([34, 0, 0, …] with the rejection rule) instead of the greedy output."""
    greedy = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=12, use_draft=False)).output_ids
    for t in (1e-38, 1e-6):
        res = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=12, temperature=t, seed=1, **kw))
        assert res.output_ids == greedy, t
        assert res.events[0].request["temperature"] == 0.0  # the trace records the greedy run that ran
    sampled = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=4, temperature=1e-5, seed=1, **kw))
    assert sampled.events[0].request["temperature"] == 1e-5


@pytest.mark.parametrize("kw", [
    dict(block_size=16, max_block_size=8),  # before: accepted here, refused only by the engine
    dict(block_size=4, min_block_size=8),  # before: the engine silently lowered min_block_size to 4
    dict(block_size=1, min_block_size=2),  # an explicit minimum is the user's: not lowered either
])
def test_contradictory_block_sizes_are_refused_at_construction(kw):
    with pytest.raises(ValidationError) as err:
        Request(**OK, **kw)
    assert err.value.param == "block_size"
    assert f"[{kw.get('min_block_size', 1)}, {kw.get('max_block_size', 64)}]" in str(err.value)


def test_an_explicit_min_block_size_above_the_drafts_block_is_refused_not_lowered(engine):
    """min_block_size 20 with the trained block (16): before, the engine ran it with a minimum of 16."""
    with pytest.raises(ValidationError) as err:
        engine.stream(Request(prompt_ids=(1,), min_block_size=20))
    assert err.value.param == "min_block_size" and "16" in str(err.value)
    assert engine.check(Request(prompt_ids=(1,), min_block_size=8), [1]) == (16, 8, 16)
    assert engine.check(Request(prompt_ids=(1,), block_size=4, min_block_size=4), [1]) == (4, 4, 16)
    assert Request(**OK).min_block_size is None  # the default: 2, or the block size when smaller
    assert engine.check(Request(prompt_ids=(1,), block_size=1), [1]) == (1, 1, 16)
    assert engine.check(Request(prompt_ids=(1,)), [1]) == (16, 2, 16)


def test_numpy_token_ids_are_accepted_and_stored_as_ints():
    import json

    import numpy as np

    req = Request(prompt_ids=list(np.array([1, 2, 3])), stop_ids=list(np.array([7], dtype=np.int32)))
    assert req.prompt_ids == (1, 2, 3) and req.stop_ids == (7,)
    assert all(type(i) is int for i in req.prompt_ids + req.stop_ids)
    assert json.loads(json.dumps(req.to_dict()))["prompt_ids"] == [1, 2, 3]
    with pytest.raises(ValidationError) as err:
        Request(prompt_ids=[np.bool_(True)])
    assert err.value.param == "prompt_ids"


@pytest.mark.parametrize("prompt", [b"x", "hello", 5])
def test_a_prompt_beside_prompt_ids_is_refused(prompt):
    """Before: accepted, the prompt ignored (and b"x" made to_dict unserialisable). The CLI refuses both too."""
    with pytest.raises(ValidationError) as err:
        Request(prompt=prompt, prompt_ids=[1])
    assert err.value.param == "prompt"


def test_a_prompt_that_leaves_no_room_names_the_prompt(engine):
    """A prompt whose tokens with one new token and one block exceed the context budget can never run: the error
    names the prompt (before: max_new_tokens, which no value could fix)."""
    budget = engine.target.max_positions  # 512; the block: the draft's trained 16
    fits = tuple([1] * (budget - 1 - 16))
    assert engine.check(Request(prompt_ids=fits, max_new_tokens=1), list(fits)) == (16, 2, 16)
    too_long = fits + (1,)
    with pytest.raises(ValidationError) as err:
        engine.stream(Request(prompt_ids=too_long, max_new_tokens=1))
    assert err.value.param == "prompt_ids" and str(len(too_long)) in str(err.value) and str(budget) in str(err.value)
