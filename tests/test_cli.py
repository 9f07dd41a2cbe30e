"""`python -m dflash generate`: bad options get one line naming the option and exit status 2 (never a traceback),
Ctrl-C stops cleanly with the partial output and a complete trace. A few runs go through a subprocess, as a user
runs it (exit status, stdout and stderr, Ctrl-C, a second start); the rest through `main(argv)` in this process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dflash.models.draft import DFlashDraftModel, DraftConfig, save_draft
from tests.cli_support import capped_memory, interruptible, run_main

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama target directory (no tokenizer: --prompt-ids only), a draft for it and a draft that does not fit it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, max_position_embeddings=8192, initializer_range=0.3, eos_token_id=None,
                      bos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(cfg).save_pretrained(tmp / "target")
    wrong = DraftConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        intermediate_size=64, vocab_size=256, num_target_layers=2, block_size=4, mask_token_id=255,
                        target_layer_ids=[1])
    save_draft(DFlashDraftModel(wrong), tmp / "wrong-draft")
    fits = DraftConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=256, num_target_layers=2, block_size=4, mask_token_id=255,
                       target_layer_ids=[0, 1])
    save_draft(DFlashDraftModel(fits), tmp / "draft")
    return tmp


def generate(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash", "generate", *args], cwd=ROOT, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def here(capsys):
    """`generate` through `main(argv)` in this process: what `generate()` returns, without a fresh interpreter."""
    from dflash.cli import main

    return lambda *args: run_main(main, ["generate", *args], capsys)


def assert_option_error(proc: subprocess.CompletedProcess, option: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]  # besides transformers' load progress
    assert len(errors) == 1 and errors[0].startswith(f"error: {option}") and proc.stderr.rstrip().endswith(errors[0]), \
        proc.stderr


@pytest.mark.parametrize("argv, option", [
    (["--help"], None),
    (["generate", "--prompt", "hi", "--threads", "0"], "--threads"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "--temperature"),  # a Request field: named by its option
    (["generate", "--prompt", "hi", "--steps", "0"], "--steps"),  # … also where the field (diffusion_steps) differs
    (["bench", "--methods", "ar", "--limit", "0"], "--limit"),
    (["bench", "--methods", "ar,beam"], "--methods"),
    (["bench", "--methods", "ar", "--lookup-ngram", "2"], "--lookup-ngram"),
    (["train", "data", "--out", "x", "--batch-size", "0"], "--batch-size"),
    (["train", "data-tf", "--out", "x", "--layers", "1,a"], "--layers"),
    (["train", "fit", "--data", "missing", "--out", "x"], "--data"),
    (["train", "eval", "--steps", "0"], "--steps"),
    (["draft", "export", "--for", "vllm", "--out", "x", "--draft", "missing"], "--draft"),
])
def test_option_errors_answer_before_torch_is_imported(tmp_path, argv, option):
    """A bad option is named at once (before, every command imported torch to build its parser: ~3 s, even for --help):
    run with a `torch` that cannot be imported, the command still answers with its one line."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "dflash", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    if option is None:
        assert proc.returncode == 0 and "generate" in proc.stdout, proc.stderr
    else:
        assert_option_error(proc, option + ":")


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_generate_and_bench_help_give_every_options_meaning_and_default(command):
    """--max-new-tokens, --top-p, --top-k, --seed and --max-block-size had no help, and no option showed its default."""
    from dflash.cli import build_parser

    parser = build_parser()._subparsers._group_actions[0].choices[command]
    for action in parser._actions:
        if action.dest != "help":
            assert action.help, action.option_strings
            if action.default is not None and action.default is not False:  # 0 and 0.0 are defaults to show
                assert "(default: " in parser.formatter_class("x")._get_help_string(action), action.option_strings
    text = " ".join(subprocess.run([sys.executable, "-m", "dflash", command, "--help"], cwd=ROOT, env=ENV,
                                   capture_output=True, text=True, timeout=60).stdout.split())
    assert "--max-new-tokens MAX_NEW_TOKENS most tokens to generate (default: 128)" in text


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench", "--methods", "ar,dflash"], ["train", "eval"]])
@pytest.mark.parametrize("folder, says", [
    ("missing", "is not a directory"),
    ("no-weights", "has no model.safetensors"),
])
def test_a_wrong_draft_folder_is_named_before_any_model_loads(tmp_path, command, folder, says):
    """It was reported after the target had loaded, as `error: draft: …` (the option not named as typed)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text("{}")
    draft = tmp_path / folder
    target = {"generate": ["--target", str(tmp_path / "no-such-target")], "train": [],
              "bench": ["--target", str(tmp_path / "no-such-target"), "--output", str(tmp_path / "r.json")]}[command[0]]
    proc = subprocess.run([sys.executable, "-m", "dflash", *command, *target, "--draft", str(draft)], cwd=ROOT,
                          env={**ENV, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert_option_error(proc, "--draft:")
    assert says in proc.stderr.splitlines()[-1] and str(draft) in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize("argv,option", [
    (["generate", "--adaptive", "Fixed"], "--adaptive: invalid choice: 'Fixed'"),
    (["bench", "--max-new-tokens", "1e3"], "--max-new-tokens: invalid int value: '1e3'"),
    (["train", "fit", "--data", "d"], "the following arguments are required: --out"),
    (["draft", "export", "--for", "tgi"], "--for: invalid choice: 'tgi'"),
    # An unknown option pointed to the top level's --help, which lists the subcommands, not their options.
    (["generate", "--prompt", "hi", "--frobnicate"], "unrecognized arguments: --frobnicate (usage: python -m dflash generate"),
    (["bench", "--frobnicate"], "unrecognized arguments: --frobnicate (usage: python -m dflash bench --help)"),
])
def test_argparses_own_errors_are_one_line_too(argv, option):
    """An invalid choice or a value that is not a number printed argparse's usage (about 20 lines) before its error."""
    proc = subprocess.run([sys.executable, "-m", "dflash", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {option}") and "--help)" in proc.stderr


@pytest.mark.parametrize("args,option", [
    (["--threads", "-1"], "--threads"),
    (["--threads", "999"], "--threads: must be in [1, "),  # more than the machine's cores: was accepted, 50x slower
    (["--device", "foo"], "--device"),
    (["--device", "tpu"], "--device"),
])
def test_bad_model_options_name_the_option(models, here, args, option):
    assert_option_error(here("--target", str(models / "target"), "--prompt-ids", "1,2", *args), option)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_an_option_error(models, here):
    assert_option_error(here("--target", str(models / "target"), "--prompt-ids", "1,2", "--device", "cuda"), "--device")


@pytest.mark.parametrize("value, says", [
    ("cuda", "DFLASH_KERNELS: must be one of auto, triton, reference, got 'cuda'"),
    ("triton", "DFLASH_KERNELS: triton on a cpu device needs TRITON_INTERPRET=1"),
])
def test_dflash_kernels_is_checked_before_the_model_loads(models, here, monkeypatch, value, says):
    """Was a traceback from the first verification, after the load."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("DFLASH_KERNELS", value)
    proc = here("--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "1,2",
                "--device", "cpu")
    assert_option_error(proc, says)
    assert "[loaded" not in proc.stderr


def test_an_option_error_names_every_option_as_typed():
    """The bound named the request field: "--max-block-size: must be >= min_block_size (4), got 2"."""
    from dflash.cli import build_parser, option_words

    args = build_parser().parse_args(["generate", "--prompt", "hi", "--draft", "top_p"])
    assert (option_words(args, "must be >= min_block_size (4) and fit max_new_tokens in /tmp/no_draft/x")
            == "must be >= --min-block-size (4) and fit --max-new-tokens in /tmp/no_draft/x")
    # Left as they are: use_draft (--no-draft means the opposite), a quoted word, a value the user typed.
    for message in ("pass use_draft=False", "unknown preset 'temperature'", "top_p is not a directory"):
        assert option_words(args, message) == message
    proc = generate("--prompt", "hi", "--min-block-size", "4", "--max-block-size", "2")
    assert_option_error(proc, "--max-block-size: must be >= --min-block-size (4), got 2")


def test_unwritable_trace_fails_before_the_model_loads(models):
    proc = generate("--target", str(models / "target"), "--prompt-ids", "1,2", "--trace", "/nonexistent/dir/x.jsonl")
    assert_option_error(proc, "--trace")
    assert "[loaded" not in proc.stderr


def test_a_refused_command_leaves_an_earlier_trace_as_it_was(models, tmp_path, here):
    """The trace was opened (truncated) before the models loaded and checked the request: a refused command left an
    earlier run's trace empty."""
    trace = tmp_path / "keep.jsonl"
    trace.write_text("an earlier run\n")
    proc = here("--target", str(models / "target"), "--no-draft", "--prompt-ids", "1,999999", "--trace", str(trace))
    assert_option_error(proc, "--prompt-ids")
    assert trace.read_text() == "an earlier run\n"
    assert_option_error(here("--target", str(models / "target"), "--prompt-ids", "1,2", "--trace", str(tmp_path)),
                        "--trace: cannot write")


def test_a_draft_for_another_target_is_refused_with_its_reason(models, here):
    proc = here("--target", str(models / "target"), "--draft", str(models / "wrong-draft"), "--prompt-ids", "1,2")
    assert_option_error(proc, "--draft: hidden_size 32 does not match the target's hidden_size 64")


def test_a_draft_with_absurd_sizes_is_refused_before_anything_is_allocated(models, tmp_path):
    """hidden_size 16384 and intermediate_size 131072 in a tiny draft's config.json: 25 GB were allocated before the
    load failed. With the address space capped at 12 GB the refusal still comes, in one line, before the target loads."""
    draft = tmp_path / "draft"
    shutil.copytree(models / "draft", draft)
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "hidden_size": 16384, "intermediate_size": 131072}))
    proc = subprocess.run([sys.executable, "-m", "dflash", "generate", "--target", str(models / "target"), "--draft",
                           str(draft), "--prompt-ids", "1,2"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120, preexec_fn=capped_memory(12))
    assert_option_error(proc, "--draft: config.json has hidden_size 16384, but model.safetensors holds a draft with "
                              "hidden_size 64")
    assert "[loaded" not in proc.stderr


@pytest.mark.parametrize("config,says", [
    ("{", "config.json is not a valid DFlash draft config: Expecting property name"),
    ("{}", "config.json is not a valid DFlash draft config: no 'hidden_size' entry"),
    ("[]", "config.json is not a valid DFlash draft config"),
])
def test_a_draft_whose_config_is_not_a_drafts_is_refused_in_one_line(models, tmp_path, here, config, says):
    """A hand-edited or truncated config.json was a traceback (ValueError / KeyError from inside the config)."""
    draft = tmp_path / "draft"
    shutil.copytree(models / "draft", draft)
    (draft / "config.json").write_text(config)
    proc = here("--target", str(models / "target"), "--draft", str(draft), "--prompt-ids", "1,2")
    assert_option_error(proc, f"--draft: {says}")


def test_json_output_and_trace_of_a_normal_run(models, tmp_path, here):
    trace = tmp_path / "t.jsonl"
    proc = here("--target", str(models / "target"), "--no-draft", "--prompt-ids", "5,6,7", "--max-new-tokens", "9",
                "--json", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "length" and len(out["output_ids"]) == 9
    last = json.loads(trace.read_text().splitlines()[-1])
    assert last["type"] == "Finished" and last["output_ids"] == out["output_ids"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (every write fails: no space left)")
def test_a_trace_whose_writes_fail_is_said_in_one_line_and_the_result_still_printed(models, here):
    """`--trace /dev/full` was a traceback at trace.close(), exit 1, and the JSON result never reached stdout."""
    proc = here("--target", str(models / "target"), "--no-draft", "--prompt-ids", "5,6,7", "--max-new-tokens", "5",
                    "--json", "--trace", "/dev/full")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.startswith("error:")] == [
        "error: --trace: writing /dev/full failed (No space left on device); the trace is incomplete"], proc.stderr
    out = json.loads(proc.stdout)
    assert out["finish_reason"] == "length" and len(out["output_ids"]) == 5


def test_the_default_block_policy_is_cost_on_a_cpu_and_the_trace_records_it(models, tmp_path, here):
    """`--adaptive auto` (the default) runs the cost policy on a CPU: after the first block at the trained size it
    measures the smallest block; `--adaptive fixed` keeps the trained size. Same tokens either way."""
    runs = {}
    for policy in ("auto", "fixed"):
        trace = tmp_path / f"{policy}.jsonl"
        args = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "5,6,7",
                "--max-new-tokens", "12", "--json", "--trace", str(trace)]
        proc = here(*args, *(["--adaptive", "fixed"] if policy == "fixed" else []))
        assert proc.returncode == 0, proc.stderr
        started = json.loads(trace.read_text().splitlines()[0])
        runs[policy] = (json.loads(proc.stdout), started["request"]["adaptive"])
    (auto, auto_policy), (fixed, fixed_policy) = runs["auto"], runs["fixed"]
    assert (auto_policy, fixed_policy) == ("cost", "fixed")
    assert auto["stats"]["block_sizes"][:2] == [4, 2]
    assert fixed["stats"]["block_sizes"][:2] == [4, 4]  # (the last blocks shrink to the tokens left)
    assert auto["output_ids"] == fixed["output_ids"]


def test_ctrl_c_stops_cleanly_with_partial_output_and_a_complete_trace(models, tmp_path):
    trace = tmp_path / "t.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dflash", "generate", "--target", str(models / "target"), "--no-draft",
                             "--prompt-ids", "5,6,7", "--max-new-tokens", "4000", "--json", "--trace", str(trace)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not trace.exists() or trace.read_text().count('"Commit"') < 5):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    out = json.loads(stdout)
    assert out["finish_reason"] == "cancelled" and 5 <= len(out["output_ids"]) < 4000
    last = json.loads(trace.read_text().splitlines()[-1])
    assert last["type"] == "Finished" and last["reason"] == "cancelled" and last["output_ids"] == out["output_ids"]


def test_the_host_settings_are_probed_once_then_read_back(models, tmp_path, here, monkeypatch):
    """The CPU settings (dtype, threads, layout) chosen by the probe appear in --json; a second start (here, `main` in
    this process) reads them from the per-machine cache; what the user fixes is kept."""
    env = {**ENV, "DFLASH_CACHE": str(tmp_path)}
    run = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "5,6,7",
           "--max-new-tokens", "4", "--json"]
    first = json.loads(generate(*run, env=env).stdout)["settings"]
    assert first["source"] == "probe" and first["block"] == 4 and first["dtype"] in ("float32", "bfloat16")
    assert {r["dtype"] for r in first["candidates"]} == {"float32", "bfloat16"}
    from dflash.loading import load

    with monkeypatch.context() as m:  # the second start in this process, reading the first one's cache
        m.setattr(load, "CACHE_DIR", tmp_path)
        again = json.loads(here(*run).stdout)["settings"]
    assert again["source"] == "cache" and again["candidates"] == first["candidates"]
    # What the user fixes, in this process (its session's cache: a probe there or a choice read back, fixed alike).
    fixed = here(*run, "--dtype", "float32", "--threads", "1")
    settings = json.loads(fixed.stdout)["settings"]
    assert (settings["dtype"], settings["threads"], settings["mode"]) == ("float32", 1, "exact")
    monkeypatch.setenv("DFLASH_THREADS", "many")  # an operator's bad value: refused before the load
    bad = here(*run)
    monkeypatch.delenv("DFLASH_THREADS")
    assert bad.returncode == 2 and "DFLASH_THREADS" in bad.stderr and "Traceback" not in bad.stderr
    monkeypatch.setenv("DFLASH_DTYPE", "float32")
    by_env = json.loads(here(*run).stdout)["settings"]
    assert by_env["dtype"] == "float32" and {r["dtype"] for r in by_env["candidates"]} == {"float32"}
    given = json.loads(here(*run, "--dtype", "bfloat16").stdout)["settings"]
    assert given["dtype"] == "bfloat16"  # the flag wins over the environment
    assert given["matmul_ms"]["native"] > 0 and given["float32_from_rows"] in (0, 16)  # measured for bfloat16 …
    assert settings["matmul_ms"] == {} and settings["float32_from_rows"] == 0  # … never for float32
    monkeypatch.setenv("DFLASH_DTYPE", "fp8")
    bad = here(*run)
    assert bad.returncode == 2 and "DFLASH_DTYPE: must be float32, bfloat16, int4 or auto" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cached_host_settings_that_do_not_fit_this_machine_are_measured_again(models, tmp_path, here, monkeypatch, caplog):
    """threads 2**80 in host-settings.json was "ValueError: Overflow when unpacking long long" at every start; 64 on
    a 2-core machine was used silently (time to first token 61 -> 267 ms). Two starts in this process, each reading
    the cache file as written; the warning is read from the log (that the log reaches stderr is tests/test_host.py's
    subprocess start)."""
    from dataclasses import asdict

    from dflash.loading import host, load

    monkeypatch.setattr(load, "CACHE_DIR", tmp_path)
    run = ["--target", str(models / "target"), "--draft", str(models / "draft"), "--prompt-ids", "5,6,7",
           "--max-new-tokens", "4", "--json", "--dtype", "float32", "--threads", "1"]
    key = host.cache_key(str(models / "target"), 4, ["float32"], [1])  # the entry the command reads
    entry = asdict(host.HostSettings(dtype="float32", threads=1, layout="linear", source="probe", block=4,
                                     machine=host.machine_key()))
    for threads in (2**80, host.usable_cores() * 32):
        (tmp_path / "host-settings.json").write_text(json.dumps({key: {**entry, "threads": threads}}))
        caplog.clear()
        proc = here(*run)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert json.loads(proc.stdout)["settings"]["source"] == "probe", proc.stderr
        assert f"the cached CPU settings do not fit this machine (threads: must be in [1, {host.usable_cores()}]" \
               in caplog.text


def test_lookup_ngram_copies_from_the_context_without_changing_the_output(models, tmp_path, here):
    """--lookup-ngram N: blocks whose anchor ends an N-gram seen before are copied (the trace says which), the output
    equals the no-draft run's; an N out of range is a one-line error naming it."""
    base = ["--target", str(models / "target"), "--prompt-ids", "5,6,7,5,6,7,5,6", "--max-new-tokens", "24", "--json",
            "--dtype", "float32"]  # the exact mode (the host probe may choose bfloat16 for one run and not the other)
    plain = here(*base, "--no-draft")
    trace = tmp_path / "copy.jsonl"
    copied = here(*base, "--draft", str(models / "draft"), "--lookup-ngram", "1", "--trace", str(trace))
    assert plain.returncode == copied.returncode == 0, copied.stderr
    out = json.loads(copied.stdout)
    assert out["output_ids"] == json.loads(plain.stdout)["output_ids"]
    sources = [e["source"] for e in map(json.loads, trace.read_text().splitlines()) if e["type"] == "Verify"]
    assert out["stats"]["copy_blocks"] == sources.count("copy") > 0
    assert_option_error(here(*base, "--lookup-ngram", "9"), "--lookup-ngram")


def test_streamed_text_ends_its_line_on_stdout(models, here):
    """Text mode: the statistics go to stderr and stdout ends with a newline (before, a shell prompt landed on the
    answer's last line whenever stderr was redirected)."""
    proc = here("--target", str(models / "target"), "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--no-draft")
    assert proc.returncode == 0 and proc.stdout.endswith("\n") and "[length] 4 tokens" in proc.stderr, proc.stderr
    assert "Loading weights" not in proc.stderr  # transformers' progress bar, for a local checkpoint read in a second


def test_prompt_and_prompt_ids_together_or_neither_is_an_option_error(models):
    """One of --prompt and --prompt-ids: both given, one would be dropped silently; neither, there is nothing to say."""
    target = ["--target", str(models / "target")]
    assert_option_error(generate(*target, "--prompt", "hello", "--prompt-ids", "1,2"), "--prompt")
    assert_option_error(generate(*target), "--prompt")


def test_draft_only_options_under_no_draft_are_named_not_silently_dropped(models, here):
    """--no-draft with --lookup-ngram / --steps: the run is the no-draft one (same output) and stderr says which
    options had no effect; without such options there is no note."""
    base = ["--target", str(models / "target"), "--no-draft", "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--json",
            "--dtype", "float32"]
    noted = here(*base, "--lookup-ngram", "3", "--steps", "3")  # 3: not the default (2)
    plain = here(*base)
    assert noted.returncode == plain.returncode == 0, noted.stderr
    assert json.loads(noted.stdout)["output_ids"] == json.loads(plain.stdout)["output_ids"]
    note = [x for x in noted.stderr.splitlines() if x.startswith("note:")]
    assert len(note) == 1 and "--steps" in note[0] and "--lookup-ngram" in note[0] and "--no-draft" in note[0]
    assert "note:" not in plain.stderr


@pytest.mark.slow
def test_prompt_dash_reads_the_message_from_standard_input(tmp_path):
    """`echo … | generate --prompt -` took "-" itself as the message (on the real default target)."""
    trace = tmp_path / "t.jsonl"
    proc = subprocess.run([sys.executable, "-m", "dflash", "generate", "--prompt", "-", "--no-draft", "--dtype", "float32",
                           "--max-new-tokens", "2", "--json", "--trace", str(trace)], input="Name one colour.\n", cwd=ROOT,
                          env={**ENV, "DFLASH_PROBE": "0"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    started = json.loads(trace.read_text().splitlines()[0])
    assert "user\nName one colour.\nassistant" in started["prompt_text"]  # echo's newline left out
