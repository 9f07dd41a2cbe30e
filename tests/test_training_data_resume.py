"""`python -m dflash train data|data-tf` resumed in an existing --out: a larger count gives exactly the shards a fresh
run makes (kept shards of complete sort windows untouched), and other settings are refused with one line naming the
option, leaving meta.json and the shards as they were. The first data run goes through a subprocess, as a user runs
it; the rest through `main(argv)` in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.cli_support import assert_option_error, run_main

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with a byte-level tokenizer (256 bytes + <|im_start|>, <|im_end|>) and a chat template:
    enough for the data stages, which tokenize ShareGPT text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("data-target") / "target"
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {"<|im_start|>": 256, "<|im_end|>": 257}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=258, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=512, initializer_range=0.3, eos_token_id=257,
                      bos_token_id=None, pad_token_id=257)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def train_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m dflash train …` in a subprocess, as a user runs it (one thread)."""
    return subprocess.run([sys.executable, "-m", "dflash", "train", *args, "--threads", "1"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=240)


def train_here(*args: str) -> int:
    """The same command through `main(argv)` in this process, for the module's fixtures (its output is left to
    pytest's capture); `--threads 1` is the session's own count (conftest)."""
    from dflash.cli import main

    return main(["train", *args, "--threads", "1"])


@pytest.fixture
def train(capsys):
    """`train(*args)`: the command in this process, read back as a subprocess's result."""
    from dflash.cli import main

    return lambda *args: run_main(main, ["train", *args, "--threads", "1"], capsys)


def shards(out: Path) -> list[dict]:
    from safetensors.torch import load_file

    return [load_file(str(p)) for p in sorted(out.glob("shard_*.safetensors"))]


def sequences(out: Path) -> list[tuple[int, ...]]:
    return [tuple(s["input_ids"][a:b].tolist()) for s in shards(out) for a, b in zip(s["offsets"][:-1], s["offsets"][1:])]


def assert_same_shards(resumed: Path, fresh: Path) -> None:
    a, b = shards(resumed), shards(fresh)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert json.loads((resumed / "meta.json").read_text()) == json.loads((fresh / "meta.json").read_text())
    seqs = sequences(resumed)
    assert len(seqs) == len(set(seqs))  # no sequence twice (nor in the held-out last shard and in training)


def stamps(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("shard_*.safetensors")}


DATA = ["--max-prompt-tokens", "40", "--max-new-tokens", "3", "--layers", "1,2", "--sampled-every", "3",
        "--temperature", "0.8", "--batch-size", "1"]


@pytest.fixture(scope="module")
def grown(target_dir, tmp_path_factory):
    """`train data` with 34 prompts, then resumed with 36, and a fresh run with 36. One prompt a shard, so the sort
    windows are 32 shards: the first window is complete at 34 prompts, the second is not."""
    tmp = tmp_path_factory.mktemp("grown")
    run = ["data", "--target", str(target_dir), *DATA]
    first = train_process(*run, "--out", str(tmp / "resumed"), "--prompts", "34")  # the entry point
    assert first.returncode == 0, first.stderr
    before = stamps(tmp / "resumed")
    assert train_here(*run, "--out", str(tmp / "resumed"), "--prompts", "36") == 0
    assert train_here(*run, "--out", str(tmp / "fresh"), "--prompts", "36") == 0
    return tmp, before


def test_a_larger_prompt_count_resumes_to_the_shards_of_a_fresh_run(grown):
    tmp, before = grown
    assert_same_shards(tmp / "resumed", tmp / "fresh")


def test_the_shards_of_complete_sort_windows_are_kept(grown):
    tmp, before = grown
    after = stamps(tmp / "resumed")
    assert len(before) == 34 and len(after) == 36
    assert all(after[f"shard_{s:05d}.safetensors"] == before[f"shard_{s:05d}.safetensors"] for s in range(32))


@pytest.mark.parametrize("args,option", [
    (["--layers", "1,3"], "--layers"),
    (["--max-new-tokens", "5"], "--max-new-tokens"),
    (["--temperature", "0.5"], "--temperature"),
    (["--batch-size", "2"], "--batch-size"),
    (["--prompts", "30"], "--prompts"),  # fewer: the later shards would stay in the corpus
])
def test_other_data_settings_are_refused_and_change_nothing(grown, train, args, option):
    tmp, _ = grown
    out = tmp / "fresh"
    meta, before = (out / "meta.json").read_text(), stamps(out)
    flags = {k: v for k, v in zip(DATA[::2], DATA[1::2])} | {"--prompts": "36"} | dict(zip(args[::2], args[1::2]))
    proc = train("data", "--target", json.loads(meta)["target"], "--out", str(out), *[x for kv in flags.items() for x in kv])
    assert_option_error(proc, option)
    assert (out / "meta.json").read_text() == meta and stamps(out) == before


def test_another_target_is_refused_before_it_is_loaded(grown, train):
    out = grown[0] / "fresh"
    meta = (out / "meta.json").read_text()
    proc = train("data", "--target", str(grown[0] / "nowhere"), "--out", str(out), *DATA, "--prompts", "36")
    assert_option_error(proc, "--target")  # not the loader's "target: cannot load ..."
    assert (out / "meta.json").read_text() == meta


TF = ["--max-prompt-tokens", "40", "--max-response-tokens", "6", "--layers", "1,2", "--batch-size", "2"]


@pytest.fixture(scope="module")
def grown_tf(target_dir, tmp_path_factory):
    """`train data-tf` with 5 conversations, resumed with 9, and a fresh run with 9 (one partial sort window)."""
    tmp = tmp_path_factory.mktemp("grown-tf")
    run = ["data-tf", "--target", str(target_dir), *TF]
    for out, count in (("resumed", "5"), ("resumed", "9"), ("fresh", "9")):
        assert train_here(*run, "--out", str(tmp / out), "--conversations", count) == 0
    return tmp


def test_a_larger_conversation_count_resumes_to_the_shards_of_a_fresh_run(grown_tf):
    assert_same_shards(grown_tf / "resumed", grown_tf / "fresh")


@pytest.mark.parametrize("args,option", [
    (["--layers", "2"], "--layers"),
    (["--max-response-tokens", "7"], "--max-response-tokens"),
])
def test_other_teacher_forced_settings_are_refused_and_change_nothing(grown_tf, target_dir, train, args, option):
    out = grown_tf / "fresh"
    meta, before = (out / "meta.json").read_text(), stamps(out)
    flags = {k: v for k, v in zip(TF[::2], TF[1::2])} | {"--conversations": "9"} | dict(zip(args[::2], args[1::2]))
    proc = train("data-tf", "--target", str(target_dir), "--out", str(out), *[x for kv in flags.items() for x in kv])
    assert_option_error(proc, option)
    assert (out / "meta.json").read_text() == meta and stamps(out) == before


def test_data_into_a_teacher_forced_directory_is_refused(grown_tf, target_dir, train):
    out = grown_tf / "fresh"
    meta = (out / "meta.json").read_text()
    proc = train("data", "--target", str(target_dir), "--out", str(out), *TF[:2], "--layers", "1,2", "--prompts", "9")
    assert_option_error(proc, "--out")
    assert (out / "meta.json").read_text() == meta


def test_an_interrupted_regrowth_leaves_no_sequence_in_two_shards(tmp_path):
    """A grown count reorders the last sort window, so its shards are made again; Ctrl-C midway must not leave
    old shards holding sequences that a new one holds too (trained on twice, or held out and trained on)."""
    from conftest import tiny_target
    from dflash.training.data import write_teacher_forced
    from dflash.training.data_config import TeacherForcedConfig

    model = tiny_target("llama", seed=3).model
    cfg = TeacherForcedConfig(target="tiny", out=str(tmp_path), conversations=9, layers=(1, 2), batch_size=2)
    rows = [([i + 1] * 3, [i + 100] * (i + 2)) for i in range(9)]  # 9 distinct (prompt, reply) rows
    write_teacher_forced(model, 0, rows[:5], tmp_path, cfg)  # the first run: shards 0-2
    calls = []

    def ctrl_c_in_the_second_forward(*_):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    model.model.register_forward_pre_hook(ctrl_c_in_the_second_forward)
    with pytest.raises(KeyboardInterrupt):  # the grown run orders the rows otherwise: every old shard is stale
        write_teacher_forced(model, 0, rows[4:] + rows[:4], tmp_path, cfg)
    seqs = sequences(tmp_path)
    assert seqs and len(seqs) == len(set(seqs))


def test_a_selection_of_no_sequence_is_refused_and_leaves_no_data_directory(target_dir, tmp_path, train):
    """It exited 0 with only meta.json in --out, on which `train fit` then crashed after the target loaded."""
    out = tmp_path / "data"
    proc = train("data-tf", "--target", str(target_dir), "--out", str(out), "--conversations", "1", "--layers", "1,2",
                 "--min-prompt-tokens", "5000", "--max-prompt-tokens", "5001")
    assert_option_error(proc, "--min-prompt-tokens")
    assert "--max-prompt-tokens 5001" in proc.stderr and not (out / "meta.json").exists()
