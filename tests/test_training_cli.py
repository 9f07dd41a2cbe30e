"""`python -m dflash train …` through a subprocess: bad options get one line naming the option, exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_support import assert_option_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("lo,hi", [("160", "160"), ("500", "100"), ("-1", "160")])
def test_a_bad_prompt_token_range_names_the_option_and_writes_nothing(tmp_path, lo, hi):
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "dflash", "train", "data-tf", "--out", str(out), "--min-prompt-tokens",
                           lo, "--max-prompt-tokens", hi], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --min-prompt-tokens:"), proc.stderr
    assert not out.exists()


def train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dflash", "train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


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
])
def test_bad_data_options_name_the_option_before_the_target_loads(tmp_path, args, option):
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
])
def test_bad_fit_options_name_the_option_before_the_target_loads(data_dir, tmp_path, args, option):
    out = tmp_path / "run"
    data = [] if "--data" in args else ["--data", str(data_dir / "data")]
    assert_option_error(train("fit", *data, "--out", str(out), *args), option)
    assert not out.exists()


@pytest.mark.parametrize("args,option", [
    (["--threads", "-1", "--limit", "1"], "--threads"),
    (["--limit", "0"], "--limit"),  # not "all prompts"
    (["--limit", "-5"], "--limit"),  # not "all but the last 5"
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--steps", "0"], "--steps"),
    (["--prompts", "no-such-set"], "--prompts"),
    (["--output", "/nonexistent/dir/eval.json"], "--output"),
])
def test_bad_eval_options_name_the_option_before_the_models_load(args, option):
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
