"""A tiny end-to-end training run: data stage on a tiny random target, fit, checkpoint, exact resume."""

import json

import pytest
import torch

from conftest import tiny_target
from dflash.draft import load_draft
from dflash.engine import Engine
from dflash.request import Request
from dflash.training.data import load_shards, write_shards
from dflash.training.fit import FitConfig, Trainer


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    target = tiny_target("llama", seed=3)
    model_dir = tmp / "target"
    target.model.save_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen).tolist() for _ in range(12)]
    write_shards(target.model, None, str(model_dir), prompts, str(tmp / "data"), layer_ids=[1, 2], batch_size=4,
                 max_new_tokens=24, sampled_every=3, temperature=0.8, seed=0)
    return tmp


def cfg(data_dir, out, steps):
    return FitConfig(data=str(data_dir / "data"), out=str(out), layers=1, target_layer_ids=[2], block_size=4, steps=steps,
                     seqs_per_step=4, anchors_per_seq=4, lr=3e-3, draft_vocab=0, mask_token_id=255, ckpt_every=5,
                     eval_every=100, holdout_shards=1)


def test_data_shards_hold_the_targets_own_greedy_continuation(data_dir):
    shards = load_shards(str(data_dir / "data"))
    assert len(shards) == 3
    s = shards[0]  # greedy shard (every 3rd is sampled)
    assert s["features"].shape == (s["input_ids"].shape[0], 2 * 64)
    target = tiny_target("llama", seed=3)
    off, plen = s["offsets"].tolist(), int(s["prompt_lens"][0])
    seq = s["input_ids"][off[0]:off[1]].tolist()
    ref = Engine(target).generate(Request(prompt_ids=tuple(seq[:plen]), max_new_tokens=24, use_draft=False))
    assert seq[plen:] == ref.output_ids
    # Stored features are the outputs of the chosen layers at each position (hidden_states[j + 1]).
    with torch.no_grad():
        hs = target.model(torch.tensor([seq]), output_hidden_states=True).hidden_states
    stored = s["features"][off[0]:off[1]].float()
    torch.testing.assert_close(stored[:, 64:], hs[3][0], atol=0.05, rtol=0.05)  # bf16 storage


def test_fit_lowers_loss_and_checkpoint_loads_into_the_engine(data_dir, tmp_path):
    tr = Trainer(cfg(data_dir, tmp_path / "run", steps=30))
    tr.fit(progress=False)
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    assert last < first
    draft, vocab = load_draft(tmp_path / "run")
    target = tiny_target("llama", seed=3)
    engine = Engine(target, draft, vocab)
    a = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=20, use_draft=False))
    d = engine.generate(Request(prompt_ids=(5, 6, 7), max_new_tokens=20))
    assert a.output_ids == d.output_ids


def test_resume_gives_the_same_next_step_loss(data_dir, tmp_path):
    straight = Trainer(cfg(data_dir, tmp_path / "a", steps=12))
    for _ in range(5):
        straight.train_step()
    expected = [straight.train_step()["loss"] for _ in range(2)]

    first = Trainer(cfg(data_dir, tmp_path / "b", steps=12))
    for _ in range(5):
        first.train_step()
    first.save()
    resumed = Trainer(cfg(data_dir, tmp_path / "b", steps=12))
    assert resumed.load() and resumed.step == 5
    got = [resumed.train_step()["loss"] for _ in range(2)]
    assert got == pytest.approx(expected, rel=1e-5)


def test_teacher_forced_labels_are_the_targets_own_predictions():
    from dflash.training.data import Capture, teacher_forced_batch

    target = tiny_target("llama", seed=3)
    ref = Engine(target).generate(Request(prompt_ids=(9, 8, 7), max_new_tokens=12, use_draft=False))
    seq = [9, 8, 7] + ref.output_ids
    other = [4, 5, 6, 7, 8, 9, 10]  # a second, different-length row exercises the padding
    cap = Capture(target.model, [1])
    rows = teacher_forced_batch(target.model, [seq, other], pad_id=0, capture=cap)
    cap.remove()
    pred = rows[0][3].tolist()
    assert pred[2:-1] == ref.output_ids[: len(pred) - 3]  # prediction after position p is token p+1
    assert rows[1][1].shape == (len(other), 64)
