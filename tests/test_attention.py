"""What the draft attends to (dflash/decode/attention.py): the capture leaves the draft's outputs as they are, the
recomputed weights are the ones the draft applies, the summary keeps top-k context positions per slot, a request
asks for it (and only then pays for it), and traces carry it (version 2) while version-1 traces still load."""

from __future__ import annotations

import json
from pathlib import Path

import engine_helpers  # noqa: F401  (one CPU thread)
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_draft, tiny_target

from dflash.decode import events as ev
from dflash.decode.attention import TOP_K, summarize
from dflash.decode.request import Request
from dflash.errors import ValidationError
from dflash.models.draft import apply_rope, attention_weights
from tests import test_cli
from tests.cli_support import assert_option_error
from tests.ui_support import PROMPT, tiny_text_engine
from ui.replay import TRACE_VERSION, Trace, dumps_trace, load_trace_file, parse_trace
from ui.trace_schema import TraceError

OLD_TRACE = Path(__file__).parent / "data" / "trace_v1_tiny.json"


@pytest.fixture(scope="module")
def engine():
    return tiny_text_engine(block_size=8)


def steps_of(events: list) -> list[ev.DraftStep]:
    return [e for e in events if isinstance(e, ev.DraftStep)]


def draft_inputs(layers: int = 2, ctx: int = 21, b: int = 8):
    """A tiny draft (4 query heads over 2 KV heads: grouped) and a block over `ctx` injected context positions."""
    target = tiny_target("llama")
    draft = tiny_draft(target, block_size=b, layers=layers).eval()
    torch.manual_seed(3)
    feats = torch.randn(1, ctx, len(draft.config.target_layer_ids) * draft.config.hidden_size)
    with torch.inference_mode():
        kv = draft.context_kv(feats, torch.arange(ctx))
    return draft, torch.randn(1, b, draft.config.hidden_size), torch.arange(ctx, ctx + b), kv


def test_capture_leaves_the_draft_output_unchanged_and_weights_are_the_applied_ones():
    draft, x, pos, kv = draft_inputs()
    with torch.inference_mode():
        plain = draft(x, pos, kv)
        weights: list = []
        traced = draft(x, pos, kv, attention=weights)
        assert torch.equal(plain, traced)  # the same computation, bit for bit: the weights are computed beside it
        assert len(weights) == 2 and weights[0].shape == (1, 4, 8, 21 + 8)
        # The recomputed weights, applied to the first layer's values, give its attention output (SDPA's).
        attn, layer = draft.layers[0].self_attn, draft.layers[0]
        h = layer.input_layernorm(x)
        q = apply_rope(attn.q_norm(attn.q_proj(h).view(1, 8, 4, 16)).transpose(1, 2), pos, draft.inv_freq)
        kb, vb = attn.kv(h, pos, draft.inv_freq)
        k, v = torch.cat([kv[0][0], kb], 2), torch.cat([kv[0][1], vb], 2)
        sdpa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert torch.allclose(weights[0] @ v.repeat_interleave(2, dim=1), sdpa, atol=1e-5)
        assert torch.allclose(weights[0].sum(-1), torch.ones(1, 4, 8), atol=1e-5)


def test_a_boolean_mask_is_applied_as_sdpa_applies_it():
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 5, 16)
    mask = torch.tensor([True, True, False, True, False])[None, None, None, :].expand(1, 1, 3, 5)
    w = attention_weights(q, k, mask, 2)
    assert torch.all(w[..., 2] == 0) and torch.all(w[..., 4] == 0)
    v = torch.randn(1, 2, 5, 16)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(w @ v.repeat_interleave(2, dim=1), ref, atol=1e-5)


def test_summary_keeps_the_top_k_context_positions_per_slot():
    draft, x, pos, kv = draft_inputs(ctx=40)
    weights: list = []
    with torch.inference_mode():
        draft(x, pos, kv, attention=weights)
    s = summarize(weights, anchor=40, top_k=5)
    assert (s["anchor"], s["context_len"], s["top_k"], s["heads"], len(s["layers"])) == (40, 40, 5, 4, 2)
    mean = weights[1][0].mean(0)  # [b, C + b]
    layer = s["layers"][1]
    for slot in range(8):
        assert len(layer["ctx_pos"][slot]) == len(layer["ctx_w"][slot]) == 5
        assert layer["ctx_w"][slot] == sorted(layer["ctx_w"][slot], reverse=True)
        # every kept weight is at least every position left out (ties aside, up to the rounding)
        left_out = [mean[slot, p].item() for p in range(40) if p not in layer["ctx_pos"][slot]]
        assert min(layer["ctx_w"][slot]) >= max(left_out) - 1e-4
        assert len(layer["block"][slot]) == 8
        assert layer["ctx_share"][slot] + sum(layer["block"][slot]) == pytest.approx(1.0, abs=1e-3)
    assert len(layer["head_ctx_share"]) == 4 and all(len(r) == 8 for r in layer["head_ctx_share"])
    assert set(s["ctx_positions"]) == {p for lay in s["layers"] for row in lay["ctx_pos"] for p in row}
    assert summarize(weights, anchor=40, top_k=100)["top_k"] == 40  # never more than the context holds


def test_request_flag_is_validated_and_off_by_default():
    assert Request(prompt="x").trace_attention is False
    with pytest.raises(ValidationError) as exc:
        Request(prompt="x", trace_attention="yes")
    assert exc.value.param == "trace_attention"


@pytest.mark.parametrize("steps", [1, 3])
def test_traced_run_proposes_the_same_tokens(engine, steps):
    """Token for token the same run, with and without capture; only the DraftSteps' attention differs."""
    req = {"prompt": PROMPT, "max_new_tokens": 20, "block_size": 6, "lookup_ngram": 0, "diffusion_steps": steps,
           "adaptive": "fixed", "confidence_threshold": 1.0 if steps > 1 else 0.9}
    plain = engine.generate(Request(**req))
    traced = engine.generate(Request(**req, trace_attention=True))
    assert traced.output_ids == plain.output_ids
    a, b = steps_of(plain.events), steps_of(traced.events)
    assert len(a) == len(b) > 0
    assert all(s.attention is None for s in a)
    for x, y in zip(a, b):
        assert (x.tokens, x.masked, x.committed) == (y.tokens, y.masked, y.committed)
        assert x.confidences == pytest.approx(y.confidences, abs=1e-6)
        att = y.attention
        assert att is not None and att["anchor"] == y.start and att["context_len"] == y.start
        assert att["top_k"] == min(TOP_K, y.start) and len(att["layers"][0]["block"]) == len(y.tokens)
        ids = engine.prompt_ids(Request(prompt=PROMPT)) + traced.output_ids
        assert att["ctx_texts"] == engine.token_texts([ids[p] for p in att["ctx_positions"]])
    verdicts = [(e.draft_tokens, e.accepted_len) for e in plain.events if isinstance(e, ev.Verify)]
    assert verdicts == [(e.draft_tokens, e.accepted_len) for e in traced.events if isinstance(e, ev.Verify)]


def test_trace_round_trip_and_a_version_1_trace_still_loads(engine, tmp_path):
    run = engine.generate(Request(prompt=PROMPT, max_new_tokens=10, block_size=4, lookup_ngram=0, trace_attention=True))
    text = dumps_trace(Trace(run.events, {"title": "t"}))
    assert json.loads(text)["version"] == TRACE_VERSION == 3
    back = parse_trace(text)
    assert back.events == run.events  # every field, attention included
    lines = "\n".join(json.dumps(ev.event_to_dict(e)) for e in run.events)  # the CLI's JSON lines
    assert parse_trace(lines).events == run.events
    assert json.loads(OLD_TRACE.read_text())["version"] == 1  # written before this change (a fixed file)
    old = load_trace_file(OLD_TRACE)
    assert steps_of(old.events) and all(s.attention is None for s in steps_of(old.events))


def tampered(events: list, change) -> str:
    doc = json.loads(dumps_trace(Trace(events, {})))
    step = next(e for e in doc["events"] if e["type"] == "DraftStep")
    change(step["attention"])
    return json.dumps(doc)


@pytest.mark.parametrize("change, message", [
    (lambda a: a["layers"][0]["ctx_pos"][1].append(0), "layer 0 does not have one row per block slot"),
    (lambda a: a["layers"][0]["block"][0].__setitem__(0, 1.5), "layer 0 does not have one row per block slot"),
    (lambda a: a.__setitem__("top_k", 65), "a size is out of range"),
    (lambda a: a["ctx_texts"].pop(), "one text each in 'ctx_texts'"),
    (lambda a: a.__setitem__("secret", 1), "must be null or the draft's attention record"),
    (lambda a: a.__setitem__("anchor", 3), "its anchor at 'start'"),
])
def test_a_malformed_attention_record_is_refused_by_name(engine, change, message):
    run = engine.generate(Request(prompt=PROMPT, max_new_tokens=6, block_size=4, lookup_ngram=0, trace_attention=True))
    with pytest.raises(TraceError) as exc:
        parse_trace(tampered(run.events, change))
    assert "(DraftStep)" in str(exc.value) and message in str(exc.value)


@pytest.mark.slow
def test_the_shipped_draft_proposes_the_same_with_capture(real_target):
    """Once on the real models: the shipped draft on the real target, float32."""
    from dflash.decode.engine import Engine
    from dflash.loading.registry import get_preset
    from dflash.models.draft import load_draft

    draft, vocab = load_draft(get_preset("default").draft)
    engine = Engine(real_target("smollm2"), draft, vocab, name="default")
    req = {"prompt": "Write a haiku about the sea.", "max_new_tokens": 24, "lookup_ngram": 0, "adaptive": "fixed"}
    plain, traced = engine.generate(Request(**req)), engine.generate(Request(**req, trace_attention=True))
    assert traced.output_ids == plain.output_ids
    for x, y in zip(steps_of(plain.events), steps_of(traced.events), strict=True):
        assert x.tokens == y.tokens and x.confidences == pytest.approx(y.confidences, abs=1e-6)
        assert y.attention["heads"] == draft.config.num_attention_heads
        assert len(y.attention["layers"]) == draft.config.num_hidden_layers


# -- the CLI: `generate --trace FILE --trace-attention` (tiny models of tests/test_cli.py) -----------------------------
models, here = test_cli.models, test_cli.here  # its fixtures: a tiny target directory and a draft that fits it


def test_cli_records_the_attention_in_its_trace(models, tmp_path, here):
    trace = tmp_path / "t.jsonl"
    base = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "5,6,7,8,9",
            "--max-new-tokens", "8", "--lookup-ngram", "0", "--adaptive", "fixed", "--json", "--trace", str(trace)]
    proc = here(*base, "--trace-attention")
    assert proc.returncode == 0, proc.stderr
    steps = steps_of(parse_trace(trace.read_text()).events)
    assert steps and all(s.attention is not None and s.attention["anchor"] == s.start for s in steps)
    assert json.loads(proc.stdout)["output_ids"] == json.loads(here(*base).stdout)["output_ids"]
    assert all(s.attention is None for s in steps_of(parse_trace(trace.read_text()).events))  # the plain run's trace


def test_cli_refuses_the_flag_without_a_trace(models, here):
    proc = here("--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "5,6",
                "--trace-attention")
    assert_option_error(proc, "--trace-attention")
    assert "needs --trace FILE" in proc.stderr
