"""`train diagnose` on a tiny model: the baselines against a brute-force count, the draft's slots against the engine's
own drafter, the probe pair, and the command itself (one subprocess; a bad option in-process)."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from dflash.cli import main
from dflash.decode.drafter import Drafter
from dflash.loading.load import load_target_model
from dflash.models.target import Target
from dflash.training.corpus import Corpus
from dflash.training.diagnose import DiagnoseConfig, DraftSlots, baseline_rows, run_diagnose, slot_accuracy
from dflash.training.fit import Trainer
from dflash.training.probes import anchors_of
from test_training_fit import cfg as fit_cfg


@pytest.fixture(scope="module")
def fitted(data_dir, tmp_path_factory):
    """A tiny draft fitted for a few steps on the tiny data set (target layer 2, blocks of 4)."""
    out = tmp_path_factory.mktemp("diag") / "draft"
    Trainer(fit_cfg(data_dir, out, steps=4)).fit(progress=False)
    return data_dir, out


def brute_lookup(ids: list[int], a: int, n: int) -> int | None:
    """The token after the last earlier occurrence of ids[a-n+1 .. a] (ending before a), by scanning back."""
    for j in range(a - 1, n - 2, -1):
        if ids[j - n + 1 : j + 1] == ids[a - n + 1 : a + 1]:
            return ids[j + 1]
    return None


def test_baselines_match_a_brute_force_count(fitted):
    data_dir, _ = fitted
    corpus = Corpus(str(data_dir / "data"), [2], holdout=1)
    rows = baseline_rows(corpus.heldout, corpus.train, 4)
    right, covered, total = Counter(), Counter(), 0
    for s in corpus.heldout:
        ids, labels = s.ids.tolist(), s.labels.tolist()
        for a in anchors_of(s, 4).tolist():
            total += 1
            for n in (1, 2, 3):
                guess = brute_lookup(ids, a, n) if a >= n else None
                covered[n] += guess is not None
                right[n] += guess == labels[a + 1]
    assert total > 0
    for n in (1, 2, 3):
        r = rows[f"lookup-{n}"]
        assert r["anchors"] == total and r["coverage"] == covered[n] / total and r["accuracy"] == right[n] / total
    assert rows["bigram"]["coverage"] >= rows["trigram"]["coverage"]  # a trigram key implies its bigram key was seen


def test_the_draft_slots_are_what_the_engines_drafter_proposes(fitted):
    """DraftSlots reads the stored features; the drafter is fed the same features as a context: same proposals."""
    data_dir, out = fitted
    from dflash.models.draft import load_draft

    draft, vocab = load_draft(out)
    model, tok = load_target_model(str(data_dir / "target"))
    target = Target(model, tok)
    corpus = Corpus(str(data_dir / "data"), list(draft.config.target_layer_ids), holdout=1)
    slots = DraftSlots(draft, model.get_input_embeddings().weight.detach().float(), target.lm_head_weight.float(), vocab)
    drafter = Drafter(draft, target.embed, target.lm_head_weight, vocab, target.vocab_size)
    s = corpus.heldout[0]
    anchors = anchors_of(s, 4)
    predicted = slots.predict(s, anchors)
    for a, row in zip(anchors.tolist(), predicted.tolist()):
        state = drafter.new_state()
        drafter.extend_context(state, s.feats.float()[None, :a], 0)
        assert drafter.propose(state, s.ids[: a + 1].tolist(), 4, 1, 0.9, None).tokens == row
    acc = slot_accuracy(slots, corpus.heldout)
    assert acc["blocks"] == sum(len(anchors_of(x, 4)) for x in corpus.heldout)
    assert acc["tau_tf"] == pytest.approx(1 + sum(acc["prefix_acc"]))
    assert all(p <= u + 1e-9 for p, u in zip(acc["prefix_acc"], acc["slot_acc"][:1]))  # slot 1: prefix = unconditional


def test_run_diagnose_writes_every_section(fitted, tmp_path):
    data_dir, out = fitted
    cfg = DiagnoseConfig(data=str(data_dir / "data"), draft=str(out), out=str(tmp_path / "d.json"), holdout_shards=1,
                         probe_steps=3, probe_seqs=2)
    result = run_diagnose(cfg)
    assert json.loads((tmp_path / "d.json").read_text())["draft"] == result["draft"]
    assert set(result["baselines"]) == {"bigram", "trigram", "lookup-1", "lookup-2", "lookup-3"}
    for name in ("mlp", "lookup"):
        assert 0.0 <= result["probes"][name]["heldout_acc"] <= 1.0 and len(result["probes"][name]["loss_curve"]) == 3
    assert result["probes"]["lookup"]["params"] > result["probes"]["mlp"]["params"]


def test_the_command_writes_json_and_a_bad_option_is_one_line(fitted, tmp_path, capsys):
    data_dir, out = fitted
    assert main(["train", "diagnose", "--data", str(data_dir / "data"), "--draft", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft" in err[0]
    run = subprocess.run([sys.executable, "-m", "dflash", "train", "diagnose", "--data", str(data_dir / "data"),
                          "--draft", str(out), "--out", str(tmp_path / "d.json"), "--holdout-shards", "1",
                          "--probe-steps", "2", "--probe-seqs", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "probe (i)" in run.stderr and json.loads((tmp_path / "d.json").read_text())["probes"]["steps"] == 2
