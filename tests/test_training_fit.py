"""A tiny end-to-end training run: data stage on a tiny random target, fit, checkpoint, exact resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_target
from dflash.models.draft import load_draft
from dflash.decode.engine import Engine
from dflash.decode.request import Request
from dflash.training.data import load_shards
from dflash.training.fit import FitConfig, Trainer
from tests.cli_support import interruptible, run_main, train_log_on_stderr


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


def test_zero_residual_init_outputs_the_normed_block_embedding(data_dir, tmp_path):
    zero = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "z", steps=1).__dict__, "residual_init": "zero"}))
    normal = Trainer(cfg(data_dir, tmp_path / "n", steps=1))
    seq = zero.corpus.train[0]
    embeds = zero.embed[seq["ids"][:4]][None]  # [1, 4, H]
    with torch.no_grad():
        ctx = zero.draft.context_kv(seq["feats"].float()[None], torch.arange(len(seq)))
        out = zero.draft(embeds, torch.arange(4), ctx)
        # Step 0 of a zero-init draft is the (final-normed) embedding itself: the shared head sees the target's scale.
        torch.testing.assert_close(out, zero.draft.norm(embeds))
        ctx_n = normal.draft.context_kv(seq["feats"].float()[None], torch.arange(len(seq)))
        assert not torch.allclose(normal.draft(embeds, torch.arange(4), ctx_n), normal.draft.norm(embeds))


def test_warm_start_and_log_spaced_snapshots(data_dir, tmp_path):
    from dflash.training.fit import is_snapshot_step

    assert [s for s in range(1, 20) if is_snapshot_step(s, 2)] == [2, 4, 8, 16]
    first = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "a", steps=4).__dict__, "snapshot_base": 2}))
    first.fit(progress=False)
    assert sorted(p.name for p in (tmp_path / "a" / "snapshots").iterdir()) == ["step_000002", "step_000004"]
    warm = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "b", steps=4).__dict__, "init_from": str(tmp_path / "a")}))
    for k, v in first.draft.state_dict().items():
        torch.testing.assert_close(warm.draft.state_dict()[k], v.to(torch.bfloat16).float())  # served weights are bf16
    with pytest.raises(ValueError, match="--init-from"):
        Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "c", steps=4).__dict__, "target_layer_ids": [1],
                             "init_from": str(tmp_path / "a")}))


def test_warm_start_grows_depth_without_changing_the_function(data_dir, tmp_path):
    first = Trainer(cfg(data_dir, tmp_path / "a", steps=3))
    first.fit(progress=False)
    deep = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "b", steps=3).__dict__, "layers": 2,
                                "init_from": str(tmp_path / "a")}))
    assert len(deep.draft.layers) == 2 and deep.draft.layers[1].mlp.up_proj.weight.abs().sum() > 0  # not a dead layer
    src, _ = load_draft(tmp_path / "a")
    feats, T = torch.randn(1, 6, src.config.hidden_size), 6
    embeds, pos = torch.randn(1, 4, src.config.hidden_size), torch.arange(T, T + 4)
    with torch.no_grad():
        want = src(embeds, pos, src.context_kv(feats, torch.arange(T)), None)
        got = deep.draft(embeds, pos, deep.draft.context_kv(feats, torch.arange(T)), None)
    torch.testing.assert_close(got, want)
    deep.fit(progress=False)  # the new layer learns: its residual writes leave 0
    assert deep.draft.layers[1].mlp.down_proj.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="--init-from"):  # a shallower run cannot start from a deeper draft
        Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "c", steps=3).__dict__, "init_from": str(tmp_path / "b")}))


def test_warm_start_fuses_a_new_target_layer_without_changing_the_function(data_dir, tmp_path):
    first = Trainer(cfg(data_dir, tmp_path / "a", steps=3))  # fuses layer 2
    first.fit(progress=False)
    # Layer 3 is the tiny target's last: not in the stored features, read from final_hidden (corpus.py).
    wide = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "b", steps=3).__dict__, "target_layer_ids": [2, 3],
                                "init_from": str(tmp_path / "a")}))
    h = first.dcfg.hidden_size
    assert wide.draft.fc.weight.shape == (h, 2 * h) and not wide.draft.fc.weight[:, h:].any()
    src, _ = load_draft(tmp_path / "a")
    f2, f3, T = torch.randn(1, 6, h), torch.randn(1, 6, h), 6
    embeds, pos = torch.randn(1, 4, h), torch.arange(T, T + 4)
    with torch.no_grad():
        want = src(embeds, pos, src.context_kv(f2, torch.arange(T)), None)
        got = wide.draft(embeds, pos, wide.draft.context_kv(torch.cat([f2, f3], -1), torch.arange(T)), None)
    torch.testing.assert_close(got, want)
    wide.fit(progress=False)  # the new layer's columns learn
    assert wide.draft.fc.weight[:, h:].abs().sum() > 0
    assert load_draft(tmp_path / "b")[0].config.target_layer_ids == [2, 3]


def test_on_policy_blocks_change_nothing_on_regenerated_data_and_stop_at_resumes(data_dir, tmp_path):
    a = Trainer(cfg(data_dir, tmp_path / "a", steps=6))
    b = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "b", steps=6).__dict__, "onpolicy_blocks": 0}))
    ra, rb = a.train_step(), b.train_step()
    assert ra["loss"] == pytest.approx(rb["loss"]) and ra["positions"] == rb["positions"] > 0
    part = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "c", steps=6).__dict__, "stop_at": 2}))
    part.fit(progress=False)
    assert part.step == 2
    rest = Trainer(cfg(data_dir, tmp_path / "c", steps=6))
    rest.fit(progress=False)
    assert rest.step == 6


def test_on_policy_blocks_drop_labels_after_a_teacher_forced_disagreement(data_dir, tmp_path):
    seq = Trainer(cfg(data_dir, tmp_path / "x", steps=1)).corpus.train[0]
    labels = seq["ids"].clone()
    labels[seq["prompt_len"] + 1::2] = (labels[seq["prompt_len"] + 1::2] + 1) % 250  # the target "disagrees" here
    tf = {"ids": seq["ids"], "labels": labels, "feats": seq["feats"], "final": seq["final"], "prompt_len": seq["prompt_len"]}
    counts = []
    for flag in (0, 1):
        tr = Trainer(FitConfig(**{**cfg(data_dir, tmp_path / f"p{flag}", steps=1).__dict__, "onpolicy_blocks": flag}))
        counts.append(tr.seq_loss(tf, torch.Generator().manual_seed(0), 0.0)[1]["positions"])
    assert 0 < counts[1] < counts[0]


def interrupt_at(trainer: Trainer, step: int) -> None:
    """Ctrl-C inside the step after `step` (its first draft forward): what a user's interrupt does mid-run."""
    def hook(*_):
        if trainer.step == step:
            raise KeyboardInterrupt

    trainer.draft.register_forward_pre_hook(hook)


def test_a_run_interrupted_between_checkpoints_resumes_to_the_same_log_and_weights(data_dir, tmp_path):
    straight = Trainer(cfg(data_dir, tmp_path / "a", steps=12))
    straight.fit(progress=False)
    first = Trainer(cfg(data_dir, tmp_path / "b", steps=12))
    interrupt_at(first, 7)  # steps 6 and 7 are logged, the checkpoint is step 5's
    with pytest.raises(KeyboardInterrupt):
        first.fit(progress=False)
    Trainer(cfg(data_dir, tmp_path / "b", steps=12)).fit(progress=False)
    rows = lambda d: [{k: v for k, v in json.loads(x).items() if k not in ("s_per_step", "positions_per_s")}  # noqa: E731
                      for x in (d / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows(tmp_path / "b")] == list(range(1, 13))  # each step once
    assert rows(tmp_path / "b") == rows(tmp_path / "a")
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "trainer_state.safetensors")) for d in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_kill_while_the_trainer_state_is_written_leaves_the_previous_checkpoint(data_dir, tmp_path, monkeypatch):
    import safetensors.torch

    tr = Trainer(cfg(data_dir, tmp_path / "run", steps=12))
    for _ in range(5):
        tr.train_step()
    tr.save()
    real = safetensors.torch.save_file

    def killed_mid_write(tensors, filename, metadata=None):
        real(tensors, filename, metadata)
        if "trainer_state" in str(filename):  # half the bytes reach the disk, then the process dies
            with open(filename, "r+b") as f:
                f.truncate(f.seek(0, 2) // 2)
            raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", killed_mid_write)
    tr.train_step()
    with pytest.raises(KeyboardInterrupt):
        tr.save()
    monkeypatch.undo()
    resumed = Trainer(cfg(data_dir, tmp_path / "run", steps=12))
    assert resumed.load() and resumed.step == 5


@pytest.mark.parametrize("change,option", [({"block_size": 8}, "--block-size"), ({"layers": 2}, "--layers"),
                                           ({"lr": 1e-3}, "--lr"), ({"steps": 20}, "--steps")])
def test_an_out_holding_another_runs_checkpoint_is_refused(data_dir, tmp_path, change, option):
    tr = Trainer(cfg(data_dir, tmp_path / "run", steps=12))
    tr.train_step()
    tr.save()
    with pytest.raises(ValueError, match=f"^{option}") as refused:
        Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "run", steps=12).__dict__, **change}))
    if option == "--steps":  # what the user may have wanted instead
        assert "--stop-at" in str(refused.value) and "--init-from" in str(refused.value)
    # Options that change no weight may differ, and the same data may be named by another path.
    same = {"ckpt_every": 3, "eval_every": 2, "stop_at": 6, "snapshot_base": 0, "threads": 1,
            "data": str(data_dir / "data") + "/"}
    assert Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "run", steps=12).__dict__, **same})).load()


def test_ctrl_c_in_train_fit_prints_one_line_and_exits_130(data_dir, tmp_path):
    out = tmp_path / "run dir"  # a space in the path, too
    cmd = [sys.executable, "-m", "dflash", "train", "fit", "--data", str(data_dir / "data"), "--out", str(out), "--layers", "1",
           "--layer-ids", "2", "--block-size", "4", "--steps", "100000", "--seqs-per-step", "1", "--draft-vocab", "0",
           "--mask-token-id", "255", "--threads", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.time() + 60
    while not (out / "train_log.jsonl").is_file() or not (out / "train_log.jsonl").read_text():  # in the training loop
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted" in err.replace("\r", "\n").splitlines(), err  # on a line of its own, not after the progress bar
    assert (out / "trainer_state.safetensors").is_file() and "run the same command to resume" in err, err


def test_train_fit_ends_by_saying_where_the_draft_is_and_what_to_run_next(data_dir, tmp_path, capsys):
    """In this process (the entry point: the Ctrl-C test above), the log on stderr as in a fresh one."""
    from dflash.cli import main

    out = tmp_path / "run"
    argv = ["train", "fit", "--data", str(data_dir / "data"), "--out", str(out), "--layers", "1", "--layer-ids", "2",
            "--block-size", "4", "--steps", "2", "--seqs-per-step", "1", "--draft-vocab", "0", "--mask-token-id", "255",
            "--threads", "1"]
    with train_log_on_stderr():
        proc = run_main(main, argv, capsys)
    assert proc.returncode == 0, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"done at step 2: the draft is in {out}; measure it with `python -m dflash train eval --draft {out}`" in last
    assert (out / "model.safetensors").is_file()


def test_a_kill_while_a_snapshot_is_written_leaves_it_to_the_resumed_run(data_dir, tmp_path, monkeypatch):
    import dflash.training.fit as fit

    snap = lambda d: {**cfg(data_dir, d, steps=4).__dict__, "snapshot_base": 2, "ckpt_every": 2}  # noqa: E731
    Trainer(FitConfig(**snap(tmp_path / "a"))).fit(progress=False)
    real = fit.save_draft

    def killed_mid_snapshot(model, directory, **kw):
        if "snapshots" in str(directory):  # its config.json is on disk, its weights are not
            Path(directory).mkdir(parents=True)
            (Path(directory) / "config.json").write_text("{}")
            raise KeyboardInterrupt
        real(model, directory, **kw)

    monkeypatch.setattr(fit, "save_draft", killed_mid_snapshot)
    with pytest.raises(KeyboardInterrupt):
        Trainer(FitConfig(**snap(tmp_path / "b"))).fit(progress=False)
    monkeypatch.undo()
    Trainer(FitConfig(**snap(tmp_path / "b"))).fit(progress=False)
    for step in ("step_000002", "step_000004"):
        want, got = load_draft(tmp_path / "a" / "snapshots" / step)[0], load_draft(tmp_path / "b" / "snapshots" / step)[0]
        assert all(torch.equal(v, got.state_dict()[k]) for k, v in want.state_dict().items())


def test_an_out_holding_a_draft_fit_did_not_make_is_refused(data_dir, tmp_path):
    from dflash.models.draft import save_draft

    tr = Trainer(cfg(data_dir, tmp_path / "run", steps=2))
    save_draft(tr.draft, tmp_path / "shipped")  # a draft directory (downloaded, exported): no training config
    before = (tmp_path / "shipped" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="^--out: .* --init-from"):
        Trainer(cfg(data_dir, tmp_path / "shipped", steps=2))
    assert (tmp_path / "shipped" / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("how", ["snapshot copied", "trainer state deleted"])
def test_an_out_holding_a_fit_draft_without_its_trainer_state_is_refused(data_dir, tmp_path, how):
    """It restarted at step 1 and overwrote the draft with its first checkpoint."""
    import shutil

    run = lambda out: FitConfig(**{**cfg(data_dir, out, steps=4).__dict__, "snapshot_base": 2})  # noqa: E731
    Trainer(run(tmp_path / "run")).fit(progress=False)
    if how == "snapshot copied":
        shutil.copytree(tmp_path / "run" / "snapshots" / "step_000002", tmp_path / "x")
    else:
        shutil.copytree(tmp_path / "run", tmp_path / "x")
        (tmp_path / "x" / "trainer_state.safetensors").unlink()
    before = (tmp_path / "x" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match=f"^--out: .* no trainer state .* --init-from {tmp_path / 'x'}"):
        Trainer(run(tmp_path / "x"))  # the same settings: only the trainer state is missing
    assert (tmp_path / "x" / "model.safetensors").read_bytes() == before


def test_a_resume_after_the_data_grew_is_refused(data_dir, tmp_path):
    """The vocabulary, the held-out shard and the batches changed: the resume was silently not exact."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_dir / "data", data)
    run = FitConfig(**{**cfg(data_dir, tmp_path / "run", steps=12).__dict__, "data": str(data)})
    tr = Trainer(run)
    tr.train_step()
    tr.save()
    shutil.copy(data / "shard_00002.safetensors", data / "shard_00003.safetensors")  # `train data --prompts` grew it
    with pytest.raises(ValueError, match="^--data: its shards changed .* --init-from"):
        Trainer(run)


def test_a_block_longer_than_every_response_is_refused(data_dir, tmp_path):
    """Every step trained nothing (loss 0, 0 positions) and a draft was written."""
    with pytest.raises(ValueError, match="^--block-size: no response in --data is long enough"):
        Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "run", steps=2).__dict__, "block_size": 30}))  # responses <= 24
    assert not (tmp_path / "run").exists()


def test_a_warm_started_run_resumes_exactly_without_its_init_from_directory(data_dir, tmp_path):
    """The resume read --init-from again: refused once it was gone, and its vocabulary taken if it had changed."""
    import shutil

    Trainer(FitConfig(**{**cfg(data_dir, tmp_path / "src", steps=2).__dict__, "draft_vocab": 64})).fit(progress=False)
    warm = lambda out: FitConfig(**{**cfg(data_dir, out, steps=8).__dict__, "draft_vocab": 64,  # noqa: E731
                                    "init_from": str(tmp_path / "src")})
    straight = Trainer(warm(tmp_path / "a"))
    expected = [straight.train_step()["loss"] for _ in range(5)]
    first = Trainer(warm(tmp_path / "b"))
    for _ in range(3):
        first.train_step()
    first.save()
    shutil.rmtree(tmp_path / "src")
    resumed = Trainer(warm(tmp_path / "b"))
    assert resumed.load() and resumed.step == 3 and torch.equal(resumed.vocab, first.vocab)
    assert [resumed.train_step()["loss"] for _ in range(2)] == pytest.approx(expected[3:], rel=1e-5)


def test_ctrl_c_checkpoints_the_interrupted_step_and_the_resume_is_exact(data_dir, tmp_path):
    """The steps since the last checkpoint were thrown away."""
    straight = Trainer(cfg(data_dir, tmp_path / "a", steps=12))
    straight.fit(progress=False)
    first = Trainer(cfg(data_dir, tmp_path / "b", steps=12))
    sent = []

    def ctrl_c_in_step_8(*_):  # as a terminal delivers it: the handler sets the flag, the step finishes
        if first.step == 7 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))

    first.draft.register_forward_pre_hook(ctrl_c_in_step_8)
    with pytest.raises(KeyboardInterrupt):
        first.fit(progress=False)
    resumed = Trainer(cfg(data_dir, tmp_path / "b", steps=12))
    assert resumed.load() and resumed.step == 8  # not step 5's checkpoint
    resumed.fit(progress=False)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / d / "trainer_state.safetensors")) for d in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_copy_weight_zero_trains_only_the_blocks_the_copy_first_chain_drafts(data_dir, tmp_path):
    from dataclasses import replace

    from dflash.decode.lookup import find
    from dflash.training.objective import sample_anchors

    every = Trainer(replace(cfg(data_dir, tmp_path / "a", 2), copy_ngram=1, anchors_per_seq=64))
    drafted = Trainer(replace(cfg(data_dir, tmp_path / "b", 2), copy_ngram=1, anchors_per_seq=64, copy_weight=0.0))
    for seq in drafted.corpus.train:
        flags = drafted.copyable(seq)
        assert flags.tolist() == [find(seq.ids[: a + 1].tolist(), 1) is not None for a in range(len(seq))]
    anchors = lambda s: sample_anchors(s.prompt_len, len(s), 4, 64, torch.Generator().manual_seed(7))  # noqa: E731
    # a sequence with blocks of both kinds (a repeated token and a fresh one among its anchors)
    seq = next(s for s in drafted.corpus.train if 0 < int(drafted.copyable(s)[anchors(s)].sum()) < len(anchors(s)))
    _, m_every = every.seq_loss(seq, torch.Generator().manual_seed(7), 0.0)
    _, m_drafted = drafted.seq_loss(seq, torch.Generator().manual_seed(7), 0.0)
    assert 0 < m_drafted["positions"] < m_every["positions"]
