"""`python -m dflash train …`: bad options get one line naming the option, exit status 2. Checks made before torch is
imported, --help and one evaluation go through a subprocess, as a user runs them; the rest through `main(argv)` in
this process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_support import assert_option_error, run_main, train_log_on_stderr
from tests.test_training_data_resume import target_dir  # noqa: F401  (a fixture: a tiny target with a tokenizer)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("lo,hi", [("160", "160"), ("500", "100"), ("-1", "160")])
def test_a_bad_prompt_token_range_names_the_option_and_writes_nothing(tmp_path, lo, hi):
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "dflash", "train", "data-tf", "--out", str(out), "--min-prompt-tokens",
                           lo, "--max-prompt-tokens", hi], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --min-prompt-tokens:"), proc.stderr
    assert not out.exists()


def train_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m dflash train …` in a subprocess, as a user runs it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dflash", "train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def train(capsys):
    """`train(*args)`: the same command through `main(argv)` in this process (no fresh interpreter)."""
    from dflash.cli import main

    return lambda *args: run_main(main, ["train", *args], capsys)


# A target or draft that does not exist: an option checked after the model loads would fail on the model instead.
# The draft is a hub id, not in the (offline) cache: a local folder that is no draft is refused before the load.
NO_TARGET = ["--target", "/nonexistent/target"]
NO_DRAFT = ["--draft", "no-such-owner/no-such-draft"]


@pytest.mark.parametrize("args,option", [
    (["data", *NO_TARGET, "--layers", "1,a"], "--layers"),
    (["data", *NO_TARGET, "--layers", "-1"], "--layers"),
    (["data", *NO_TARGET, "--batch-size", "0"], "--batch-size"),
    (["data", *NO_TARGET, "--prompts", "0"], "--prompts"),
    (["data", *NO_TARGET, "--temperature", "nan"], "--temperature"),
    (["data-tf", *NO_TARGET, "--batch-size", "0"], "--batch-size"),
    (["data-tf", *NO_TARGET, "--threads", "0"], "--threads"),
    (["data-tf", *NO_TARGET, "--max-prompt-tokens", "0"], "--max-prompt-tokens"),  # blamed --min-prompt-tokens
    (["data-tf", "--target", "/nonexistent/model"], "--target"),  # said "error: target: …"
    (["data", "--target", "/nonexistent/model"], "--target"),
])
def test_bad_data_options_name_the_option_before_the_target_loads(tmp_path, train, args, option):
    out = tmp_path / "data"
    assert_option_error(train(*args, "--out", str(out)), option)
    assert not out.exists()


@pytest.mark.parametrize("args,option", [
    (["--data", "/nonexistent/data", "--lr", "0"], "--lr"),
    (["--data", "/nonexistent/data"], "--data"),
    (["--data", "/nonexistent/data", "--layer-ids", "1,a"], "--layer-ids"),
    (["--data", "/nonexistent/data", "--residual-init", "foo"], "--residual-init"),
    (["--data", "/nonexistent/data", "--ckpt-every", "0"], "--ckpt-every"),
    (["--data", "/nonexistent/data", "--clip", "nan"], "--clip"),
    (["--layer-ids", "7"], "--layer-ids"),  # the data stores layers 1 and 2 of a 4-layer target
    (["--mask-token-id", "256"], "--mask-token-id"),  # the target's vocabulary has 256 tokens
    (["--init-from", "/nonexistent/draft"], "--init-from"),
    (["--init-from", "TARGET"], "--init-from"),  # a Hugging Face model's config.json: "error: draft: …" after the load
    (["--data", "/nonexistent/data", "--steps", "20", "--stop-at", "30"], "--stop-at"),  # ran 10 steps at lr 0
    (["--draft-vocab", "300"], "--draft-vocab"),  # above the target's 256 tokens
    (["--draft-vocab", "1"], "--draft-vocab"),  # the stop id alone
])
def test_bad_fit_options_name_the_option_before_the_target_loads(data_dir, tmp_path, train, args, option):
    out = tmp_path / "run"
    data = [] if "--data" in args else ["--data", str(data_dir / "data")]
    args = [str(data_dir / "target") if a == "TARGET" else a for a in args]
    assert_option_error(train("fit", *data, "--out", str(out), *args), option)
    assert not out.exists()


def fit_without_torch(tmp_path: Path, data: str, out: Path) -> subprocess.CompletedProcess:
    return train_without_torch(tmp_path, "fit", "--data", data, "--out", str(out), "--layer-ids", "2")


def test_a_data_directory_without_shards_is_refused_before_anything_loads(data_dir, tmp_path):
    """A data-tf run that selected no sequence left meta.json alone: fit crashed after the target loaded."""
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(data_dir / "data" / "meta.json", empty)
    proc = fit_without_torch(tmp_path, f"{data_dir / 'data'},{empty}", tmp_path / "run")
    assert_option_error(proc, "--data")
    assert f"{empty} holds no shards" in proc.stderr and not (tmp_path / "run").exists()


def test_data_made_for_another_target_is_refused_before_anything_loads(data_dir, tmp_path):
    """It was an IndexError in the corpus reader when the features of another hidden size were read."""
    other = tmp_path / "other"
    shutil.copytree(data_dir / "data", other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps(meta | {"hidden_size": 96}))
    proc = fit_without_torch(tmp_path, f"{data_dir / 'data'},{other}", tmp_path / "run")
    assert_option_error(proc, "--data")
    assert f"{other} was made for another target" in proc.stderr and "hidden_size 96" in proc.stderr


def cut_in_half(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)


def test_a_truncated_shard_is_named_before_anything_loads(data_dir, tmp_path):
    """A shard cut short (a copy or a disk) was a SafetensorError traceback, after the target loaded, naming no shard."""
    data = tmp_path / "data"
    shutil.copytree(data_dir / "data", data)
    cut_in_half(data / "shard_00001.safetensors")
    proc = fit_without_torch(tmp_path, str(data), tmp_path / "run")
    assert_option_error(proc, "--data")
    assert (f"error: --data: {data / 'shard_00001.safetensors'} is unreadable or truncated (Error while deserializing "
            "header: incomplete metadata, file not fully covered); run the `train data` or `train data-tf` command that "
            f"made {data} again: it makes such a shard again") in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_resumed_data_run_makes_a_truncated_last_shard_again(target_dir, tmp_path, train):
    """`train data-tf` resumed over a shard cut short: was a SafetensorError traceback naming no shard. Both runs in
    this process (`train data`'s entry point: tests/test_training_data_resume.py), the log on stderr as in a fresh
    one."""
    from safetensors.torch import load_file

    run = ["data-tf", "--target", str(target_dir), "--out", str(tmp_path / "tf"), "--max-prompt-tokens", "40",
           "--max-response-tokens", "4", "--layers", "1", "--batch-size", "2", "--conversations", "4", "--threads", "1"]
    assert train(*run).returncode == 0
    last = tmp_path / "tf" / "shard_00001.safetensors"
    made = {k: v.clone() for k, v in load_file(str(last)).items()}  # not the mapped file, which is cut next
    cut_in_half(last)
    with train_log_on_stderr():
        proc = train(*run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "shard_00001" in line]
    assert len(said) == 1 and said[0].endswith("shard_00001.safetensors is unreadable or truncated (Error while "
                                               "deserializing header: incomplete metadata, file not fully covered): it "
                                               "will be made again"), proc.stderr
    again = load_file(str(last))
    assert again.keys() == made.keys() and all(again[k].equal(made[k]) for k in made)


def test_a_layer_missing_in_one_of_several_data_directories_names_that_directory(data_dir, tmp_path, train):
    other = tmp_path / "layer-1-only"
    shutil.copytree(data_dir / "data", other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps(meta | {"layer_ids": [1]}))
    proc = train("fit", "--data", f"{data_dir / 'data'},{other}", "--out", str(tmp_path / "run"), "--layer-ids", "2")
    assert_option_error(proc, "--layer-ids")
    assert f"error: --layer-ids: {other}: target layers [2]" in proc.stderr


@pytest.mark.parametrize("stage", ["fit", "data", "data-tf"])
def test_an_out_that_is_a_file_is_refused_before_the_target_loads(data_dir, tmp_path, train, stage):
    """It was a FileExistsError traceback once the target had loaded."""
    out = tmp_path / "a-file"
    out.write_text("keep me")
    args = ["--data", str(data_dir / "data")] if stage == "fit" else NO_TARGET
    proc = train(stage, *args, "--out", str(out))
    assert_option_error(proc, "--out")
    assert out.read_text() == "keep me"


def test_fit_and_data_refuse_each_others_directories_and_unrelated_ones(data_dir, tmp_path, train):
    """--data and --out mixed up: fit wrote its run into the data directory (which then read as a draft too), and
    data-tf its shards into a run's; a directory of other files was written into as well."""
    data = data_dir / "data"
    before = sorted(p.name for p in data.iterdir())
    proc = fit_without_torch(tmp_path, str(data), data)
    assert_option_error(proc, "--out")
    assert "holds training data" in proc.stderr and sorted(p.name for p in data.iterdir()) == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    proc = fit_without_torch(tmp_path, str(data), other)
    assert_option_error(proc, "--out")
    assert "(notes.txt)" in proc.stderr and [p.name for p in other.iterdir()] == ["notes.txt"]
    for stage in ("data", "data-tf"):
        for out, says in ((data_dir / "target", "holds a model, a draft or a `train fit` run"), (other, "(notes.txt)")):
            proc = train(stage, *NO_TARGET, "--out", str(out))
            assert_option_error(proc, "--out")
            assert says in proc.stderr and not list(out.glob("shard_*")) and not (out / "meta.json").exists()


def test_a_data_directory_that_does_not_exist_says_so(tmp_path):
    proc = fit_without_torch(tmp_path, str(tmp_path / "no-such-data"), tmp_path / "run")
    assert_option_error(proc, "--data")
    assert f"{tmp_path / 'no-such-data'} does not exist" in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [["train", "data-tf", "--out", "OUT", "--conversation", "3"],
                                  ["generate", "--max-new", "5"]])
def test_a_prefix_of_an_option_is_not_taken_for_it(tmp_path, args):
    """`--conversation 3` was read as --conversations 3, and a resume's error then quoted that value."""
    proc = subprocess.run([sys.executable, "-m", "dflash", *[str(tmp_path / "d") if a == "OUT" else a for a in args]],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: unrecognized arguments: {' '.join(args[-2:])}"), proc.stderr
    assert not (tmp_path / "d").exists()


def test_fit_help_shows_every_options_meaning_and_default():
    """26 of its 28 options had no help and showed no default."""
    from dflash.cli import build_parser

    fit = build_parser()._subparsers._group_actions[0].choices["train"]._subparsers._group_actions[0].choices["fit"]
    for action in fit._actions:
        if action.dest in ("help", "data", "out", "layer_ids"):  # required, or no FitConfig default (the z-lab rule)
            continue
        assert action.help and "(default: " in action.help, action.option_strings
    text = " ".join(train_process("fit", "--help").stdout.split())
    assert "--layers LAYERS the draft's depth" in text and "(default: 2000)" in text
    assert "--draft-vocab DRAFT_VOCAB draft vocabulary" in text


@pytest.mark.parametrize("stage", ["data", "data-tf", "eval"])
def test_data_and_eval_help_show_every_options_meaning_and_default(stage):
    """data-tf's --conversations (the size of a run) had no help and showed no default: a workshop could not size one."""
    from dflash.cli import build_parser

    parser = build_parser()._subparsers._group_actions[0].choices["train"]._subparsers._group_actions[0].choices[stage]
    for action in parser._actions:
        assert action.help, action.option_strings
    text = " ".join(train_process(stage, "--help").stdout.split())
    assert {"data": "--prompts PROMPTS number of training prompts: the size of the run (default: 2000)",
            "data-tf": "--conversations CONVERSATIONS ShareGPT conversations read: the size of the run (default: 4000)",
            "eval": "--limit LIMIT first N prompts of the set (>= 1) (default: 20)"}[stage] in text


def test_a_draft_directory_that_is_no_draft_and_a_block_above_the_drafts_are_refused_before_the_target_loads(data_dir, tmp_path,
                                                                                                              train):
    from conftest import tiny_draft, tiny_target
    from dflash.models.draft import save_draft

    save_draft(tiny_draft(tiny_target(), block_size=4), tmp_path / "draft")
    assert_option_error(train("eval", "--draft", str(tmp_path / "draft"), "--block-size", "64"), "--block-size")
    proc = train("eval", "--draft", str(data_dir / "target"))  # a Hugging Face model directory
    assert_option_error(proc, "--draft")
    assert "is not a valid DFlash draft config" in proc.stderr


@pytest.mark.parametrize("args,option", [
    (["--threads", "-1", "--limit", "1"], "--threads"),
    (["--limit", "0"], "--limit"),  # not "all prompts"
    (["--limit", "-5"], "--limit"),  # not "all but the last 5"
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--steps", "0"], "--steps"),
    (["--prompts", "no-such-set"], "--prompts"),
    (["--output", "/nonexistent/dir/eval.json"], "--output"),
    (["--block-size", "1"], "--block-size"),  # drafts nothing
])
def test_bad_eval_options_name_the_option_before_the_models_load(train, args, option):
    assert_option_error(train("eval", *NO_DRAFT, *args), option)


def train_without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`train` with a `torch` that cannot be imported: an answer with its one line came before any model loads."""
    (tmp_path / "no-torch" / "torch").mkdir(parents=True, exist_ok=True)
    (tmp_path / "no-torch" / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path / "no-torch")}
    return subprocess.run([sys.executable, "-m", "dflash", "train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_eval_output_that_is_a_directory_is_refused_before_the_models_load(tmp_path):
    """It was a traceback (IsADirectoryError) after the whole evaluation."""
    proc = train_without_torch(tmp_path, "eval", "--output", str(tmp_path))
    assert_option_error(proc, "--output")
    assert proc.stderr.rstrip().endswith(f"error: --output: {tmp_path} is a directory; give a file path")


@pytest.mark.parametrize("rows, says", [
    ([], "gave no prompts"),  # evaluated 0 prompts and printed tau 0
    ([{"promt": "a"}], "line 1: no prompt text"),
    ([{"prompt": "a"}, {"prompt": ""}], 'line 2: "prompt" is empty'),
])
def test_an_eval_prompt_set_without_prompts_is_refused_before_the_models_load(tmp_path, rows, says):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = train_without_torch(tmp_path, "eval", "--prompts", str(prompts))
    assert_option_error(proc, "--prompts")
    assert says in proc.stderr.splitlines()[-1], proc.stderr


def test_eval_takes_prompt_ids_rows_as_they_are(tmp_path):
    """Rows with prompt_ids only were dropped (0 prompts evaluated, tau 0); the loop takes token ids as they are."""
    from dflash.cli import build_parser
    from dflash.training.fit_cli import eval_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n{"prompt_ids": [4, 5], "prompt": "a label"}\n')
    assert eval_prompts(build_parser().parse_args(["train", "eval", "--prompts", str(prompts)])) == [[1, 2, 3], [4, 5]]


def shipped_draft() -> Path:
    from dflash.loading.registry import DEFAULT_DRAFT_DIR

    if not (DEFAULT_DRAFT_DIR / "model.safetensors").is_file():
        pytest.skip("no trained draft installed")
    return DEFAULT_DRAFT_DIR


def test_eval_tells_a_person_what_it_measured_and_keeps_stdout_one_json_line(tmp_path):
    """It printed only the JSON line: τ, the histogram and the speedup were there for scripts, not for a person. The
    line records the block size used (it said null for the draft's trained size)."""
    trained = json.loads((shipped_draft() / "config.json").read_text())["block_size"]  # the preset's draft, eval's
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hi"}\n')
    proc = train_process("eval", "--prompts", str(prompts), "--max-new-tokens", "4", "--threads", "1")  # the entry point
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    out = json.loads(line)
    assert out["block_size"] == trained
    assert f"τ = {out['tau']:.2f} tokens per verify over 1 prompt(s), {out['n_verify']} verifies" in proc.stderr
    assert "tokens committed per verify: " in proc.stderr
    assert f"speed vs no draft: {out['speedup']:.2f}×" in proc.stderr
    assert "outputs identical to the no-draft run: 1/1" in proc.stderr  # float32: the exact mode


def test_eval_of_a_truncated_draft_is_one_line_naming_draft(tmp_path, train):
    """A draft read while `train fit` wrote it was a SafetensorError traceback."""
    draft = tmp_path / "draft"
    shutil.copytree(shipped_draft(), draft)
    with open(draft / "model.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    proc = train("eval", "--draft", str(draft), "--limit", "1", "--threads", "1", "--quiet")
    assert_option_error(proc, "--draft")
    assert "model.safetensors is unreadable" in proc.stderr
