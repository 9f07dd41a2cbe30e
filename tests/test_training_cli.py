"""`python -m dflash train …` through a subprocess: bad options get one line naming the option, exit status 2."""

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
NO_TARGET = ["--target", "/nonexistent/target"]
NO_DRAFT = ["--draft", "/nonexistent/draft"]


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
