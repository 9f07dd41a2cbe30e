"""The hinted draft (`DraftConfig.hint_ngram` > 0): masked slots also read the tokens a copy from the context proposes.
Its config round trip and z-lab's format left as it is, the step-0 identity with its source, the engine's hints equal
to training's, lossless decoding through the engine, training of the hint weights alone, and the export refusal."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.decode.lookup import HintIndex, block_hints, match_table
from dflash.decode.request import Request
from dflash.models.draft import CONFIG_NAME, DFlashDraftModel, load_draft, save_draft
from dflash.training.fit import FitConfig, Trainer
from dflash.training.objective import AnchorHints
from tests.cli_support import run_main


def hinted(draft: DFlashDraftModel, n: int = 3, seed: int = 5) -> DFlashDraftModel:
    """`draft` with hint weights: its own weights, and random hint weights (the hints change what it proposes)."""
    out = DFlashDraftModel(dataclasses.replace(draft.config, hint_ngram=n))
    missing, _ = out.load_state_dict(draft.state_dict(), strict=False)
    assert sorted(missing) == ["hint_gate", "hint_len.weight", "hint_proj.weight"]
    torch.manual_seed(seed)
    with torch.no_grad():
        out.hint_proj.weight.normal_(std=0.5)
        out.hint_len.weight.normal_(std=0.5)
    return out.eval()


def test_the_match_table_is_what_the_engines_index_finds_at_every_position():
    gen = torch.Generator().manual_seed(0)
    for vocab in (2, 3, 7):
        ids = torch.randint(0, vocab, (120,), generator=gen).tolist()
        index, table = HintIndex(3), match_table(ids, 3)
        assert [index.find(ids[: a + 1]) for a in range(len(ids))] == table
    assert match_table([4, 5, 6, 4, 5, 9, 4, 5], 3)[-1] == (2, 4)  # the longest n first, the most recent occurrence
    assert block_hints([4, 5, 6, 4, 5, 9, 4, 5], (2, 4), 4) == ([0, 9, 4, 5], [0, 2, 2, 2])
    assert block_hints([1, 2, 3], (0, -1), 3) == ([0, 0, 0], [0, 0, 0])


def test_the_config_round_trip_keeps_the_hint_and_zlab_configs_carry_no_key(tmp_path):
    target = tiny_target("llama")
    plain = tiny_draft(target, block_size=4)
    save_draft(plain, tmp_path / "plain")
    save_draft(hinted(plain), tmp_path / "hinted")
    assert "hint_ngram" not in json.loads((tmp_path / "plain" / CONFIG_NAME).read_text())["dflash_config"]
    assert json.loads((tmp_path / "hinted" / CONFIG_NAME).read_text())["dflash_config"]["hint_ngram"] == 3
    back, _ = load_draft(tmp_path / "hinted")
    assert back.config.hint_ngram == 3 and back.hint_proj.weight.abs().sum() > 0


def test_hints_at_zero_compute_the_source_draft_and_otherwise_change_it():
    target = tiny_target("llama")
    plain = tiny_draft(target, block_size=4).eval()
    h = hinted(plain)
    x, pos = torch.randn(1, 4, 64), torch.arange(6, 10)
    hint_x, hint_n = torch.randn(1, 4, 64), torch.tensor([[0, 2, 2, 1]])
    ctx = plain.context_kv(torch.randn(1, 6, plain.fc.in_features), torch.arange(6))
    with torch.no_grad():
        want = plain(x, pos, ctx)
        assert not torch.allclose(h(h.block_inputs(x, hint_x, hint_n), pos, ctx), want)
        torch.testing.assert_close(h(h.block_inputs(x, hint_x, torch.zeros_like(hint_n)), pos, ctx), want)
        h.hint_proj.weight.zero_()
        h.hint_len.weight.zero_()
        torch.testing.assert_close(h(h.block_inputs(x, hint_x, hint_n), pos, ctx), want)


@pytest.mark.parametrize("lookup", [0, 2])
def test_a_hinted_draft_through_the_engine_is_lossless(lookup):
    target = tiny_target("llama")
    prompt = (5, 6, 7, 5, 6, 7, 5, 6)  # repeats: the hints have matches from the first block on
    ref = Engine(target).generate(Request(prompt_ids=prompt, max_new_tokens=40, use_draft=False))
    request = Request(prompt_ids=prompt, max_new_tokens=40, lookup_ngram=lookup)
    out = Engine(target, hinted(tiny_draft(target, block_size=4))).generate(request)
    assert out.output_ids == ref.output_ids
    plain = Engine(target, tiny_draft(target, block_size=4)).generate(request)
    drafted = lambda r: [e.tokens for e in r.events if type(e).__name__ == "DraftStep"]  # noqa: E731
    assert drafted(out) and drafted(out) != drafted(plain)  # the hints reached the draft


def test_training_reads_the_hints_the_engine_computes(data_dir):
    from dflash.training.corpus import Corpus

    seq = Corpus(str(data_dir / "data"), [2], 0).train[0]
    anchors = torch.arange(seq.prompt_len, len(seq) - 4)
    ids, lens = AnchorHints(2)(seq, anchors, 4)
    ids_list = seq.ids.tolist()
    for row, a in enumerate(anchors.tolist()):
        index = HintIndex(2)
        want = block_hints(ids_list[: a + 1], index.find(ids_list[: a + 1]), 4)
        assert (ids[row].tolist(), lens[row].tolist()) == want


def fit_cfg(data_dir, out, **over) -> FitConfig:
    base = dict(data=str(data_dir / "data"), out=str(out), layers=1, target_layer_ids=[2], block_size=4, steps=6,
                seqs_per_step=4, anchors_per_seq=16, lr=3e-3, draft_vocab=0, mask_token_id=255, ckpt_every=6,
                eval_every=100, holdout_shards=1, snapshot_base=0)
    return FitConfig(**{**base, **over})


def test_train_only_hint_moves_the_hint_weights_alone_and_the_result_serves(data_dir, tmp_path):
    Trainer(fit_cfg(data_dir, tmp_path / "base", steps=3)).fit(progress=False)
    run = Trainer(fit_cfg(data_dir, tmp_path / "hint", init_from=str(tmp_path / "base"), hint_ngram=2, train_only="hint"))
    assert not run.draft.hint_proj.weight.any()  # a warm start: hints unread at step 0
    run.fit(progress=False)
    src, _ = load_draft(tmp_path / "base")
    got, _ = load_draft(tmp_path / "hint")
    assert got.config.hint_ngram == 2 and got.hint_proj.weight.abs().sum() > 0
    same = {k: torch.equal(v, got.state_dict()[k]) for k, v in src.state_dict().items()}
    assert all(same.values()), [k for k, v in same.items() if not v]
    target = tiny_target("llama", seed=3)
    engine = Engine(target, got)
    plain = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=20, use_draft=False))
    assert engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=20)).output_ids == plain.output_ids


def test_hint_options_are_checked_and_a_hinted_source_needs_hints(data_dir, tmp_path, capsys):
    from dflash.cli import main

    with pytest.raises(ValueError, match="--train-only"):
        fit_cfg(data_dir, tmp_path / "a", train_only="hint")
    with pytest.raises(ValueError, match="--hint-ngram"):
        fit_cfg(data_dir, tmp_path / "a", hint_ngram=9)
    bad = run_main(main, ["train", "fit", "--data", str(data_dir / "data"), "--out", str(tmp_path / "b"),
                          "--train-only", "all"], capsys)
    assert bad.returncode == 2 and "--train-only" in bad.stderr and "Traceback" not in bad.stderr
    Trainer(fit_cfg(data_dir, tmp_path / "h", steps=2, hint_ngram=2)).fit(progress=False)
    with pytest.raises(ValueError, match="hinted draft"):
        Trainer(fit_cfg(data_dir, tmp_path / "c", init_from=str(tmp_path / "h")))


def test_a_hinted_draft_is_not_exported_for_servers(tmp_path, capsys):
    from dflash.cli import main

    save_draft(hinted(tiny_draft(tiny_target("llama"), block_size=4)), tmp_path / "d")
    res = run_main(main, ["draft", "export", "--draft", str(tmp_path / "d"), "--for", "sglang", "--out",
                          str(tmp_path / "o")], capsys)
    assert res.returncode == 2 and "hinted draft" in res.stderr and not (tmp_path / "o").exists()


def hinted_text_engine():
    from dflash.models.target import Target
    from tests.ui_support import char_tokenizer

    base = tiny_target("llama")
    target = Target(base.model, char_tokenizer(), name="tiny")
    return Engine(target, hinted(tiny_draft(target, block_size=4)), name="tiny")


PROMPT = "abcabcabc <&> abcabc"  # repeats (hints from the first block on) and markup (escaped in the page)


def test_draft_steps_carry_the_hints_into_traces_and_the_inspector():
    from dflash.decode import events as ev
    from ui.render_inspector import inspector_html
    from ui.replay import Trace, dumps_trace, parse_trace
    from ui.trace_schema import TraceError

    run = hinted_text_engine().generate(Request(prompt=PROMPT, max_new_tokens=16, lookup_ngram=0))
    steps = [e for e in run.events if isinstance(e, ev.DraftStep)]
    assert steps and all(len(s.hints) == len(s.hint_texts) == len(s.hint_n) == len(s.tokens) for s in steps)
    assert any(n > 0 for s in steps for n in s.hint_n)
    text = dumps_trace(Trace(run.events, {"title": "hints"}))
    assert parse_trace(text).events == run.events
    doc = json.loads(text)
    next(e for e in doc["events"] if e["type"] == "DraftStep")["hint_n"].append(1)
    with pytest.raises(TraceError, match="'hint_n' must be null or have one entry per block position"):
        parse_trace(json.dumps(doc))
    block = next(s.block for s in steps if any(s.hint_n))
    page = inspector_html(run.events, block)
    assert "copy hints" in page and "-gram</small>" in page and "<&>" not in page
    plain = Engine(tiny_target("llama")).generate(Request(prompt_ids=(5, 6, 5, 6), max_new_tokens=4, use_draft=False))
    assert "copy hints" not in inspector_html(plain.events)


@pytest.mark.slow
def test_the_shipped_hinted_draft_is_lossless_on_the_real_target_and_reads_hints(real_target):
    """The `hinted` preset's draft on the real target, float32: the output is the target's own, token for token, and
    its steps carry hints (the prompt repeats itself, so the copies have matches)."""
    from dflash.decode import events as ev
    from dflash.loading.registry import get_preset

    draft, vocab = load_draft(get_preset("hinted").draft)
    assert draft.config.hint_ngram == 3
    engine = Engine(real_target("hinted"), draft, vocab, name="hinted")
    prompt = "Repeat this list twice: apples, pears, plums, figs."
    plain = engine.generate(Request(prompt=prompt, max_new_tokens=40, use_draft=False))
    for lookup in (2, 0):  # the draft alone last: its every block reads the hints
        run = engine.generate(Request(prompt=prompt, max_new_tokens=40, lookup_ngram=lookup))
        assert run.output_ids == plain.output_ids
    steps = [e for e in run.events if isinstance(e, ev.DraftStep) and e.hints is not None]
    assert steps and any(n for s in steps for n in s.hint_n)
