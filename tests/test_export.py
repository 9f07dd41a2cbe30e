"""`python -m dflash draft export` (dflash/loading/export.py) through the command line: the full-head export of the shipped
draft for SGLang or vLLM, vLLM's draft-vocabulary form (d2t) on a tiny draft and target, one-line errors for bad
options; and docs/deploy.md's serving numbers and front matter against the draft and the README. The vLLM export
runs in a subprocess, as a user runs it; the rest through `main(argv)` in this process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.models.draft import CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME, load_draft, save_draft
from dflash.loading.registry import DEFAULT_DRAFT_DIR
from tests.cli_support import run_main
from tests.conftest import VOCAB, tiny_draft, tiny_target

ROOT = Path(__file__).resolve().parent.parent
shipped = pytest.mark.skipif(not (DEFAULT_DRAFT_DIR / CONFIG_NAME).is_file(), reason="no trained draft installed")


def export_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m dflash draft export …` in a subprocess, as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dflash", "draft", "export", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def export(capsys):
    """`export(*args)`: the same command through `main(argv)` in this process (no fresh interpreter)."""
    from dflash.cli import main

    return lambda *args: run_main(main, ["draft", "export", *args], capsys)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny target saved as a Hugging Face directory (tied head: stored as the embedding) and a tiny draft for it
    with a draft vocabulary of 40 of its 256 tokens."""
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_target("llama")
    target.model.save_pretrained(root / "target")
    vocab = torch.randperm(VOCAB - 1, generator=torch.Generator().manual_seed(0))[:40].sort().values
    save_draft(tiny_draft(target, block_size=4), root / "draft", vocab_ids=vocab, extra_config={"dflash_training": {"steps": 1}})
    return root, target, vocab


@shipped
@pytest.mark.parametrize("server", ["sglang", "full-head"])
def test_the_full_head_export_is_the_same_draft_without_our_extensions(tmp_path, export, server):
    out = tmp_path / server
    done = export("--for", server, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]  # no draft vocabulary
    model, vocab = load_draft(out)
    original, _ = load_draft(DEFAULT_DRAFT_DIR)
    assert vocab is None
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values()))
    config = json.loads((out / CONFIG_NAME).read_text())
    shipped_config = json.loads((DEFAULT_DRAFT_DIR / CONFIG_NAME).read_text())
    assert config == {k: v for k, v in shipped_config.items() if k != "dflash_training"}
    readme = (out / "README.md").read_text()
    block = shipped_config["block_size"]
    assert "full** LM head" in readme and "acceptance (τ) differs" in readme
    assert f"--speculative-num-draft-tokens {block}" in readme
    assert (f'"num_speculative_tokens": {block - 1}' in readme) == (server == "full-head")


def test_the_vllm_export_keeps_the_draft_vocabulary_in_vllms_form(tiny, tmp_path):  # a subprocess: the entry point
    root, target, vocab = tiny
    out = tmp_path / "vllm"
    done = export_process("--draft", str(root / "draft"), "--for", "vllm", "--target", str(root / "target"), "--out",
                          str(out))
    assert done.returncode == 0, done.stderr
    assert not (out / VOCAB_NAME).exists()
    config = json.loads((out / CONFIG_NAME).read_text())
    assert config["draft_vocab_size"] == len(vocab) and "dflash_training" not in config
    tensors = load_file(str(out / WEIGHTS_NAME))
    # vLLM's DFlash model: draft index i stands for target id i + d2t[i]; its logits are lm_head(hidden) there.
    d2t = tensors.pop("d2t")
    assert d2t.dtype == torch.int64 and torch.equal(torch.arange(len(vocab)) + d2t, vocab)
    # … stored in the draft's own dtype (bfloat16): it was float32, 1.5x the file of the shipped draft's export.
    head, dtype = tensors.pop("lm_head.weight"), tensors["fc.weight"].dtype
    assert dtype == torch.bfloat16 and head.dtype == dtype
    assert torch.equal(head, target.model.get_output_embeddings().weight.detach()[vocab].to(dtype))
    assert tensors.keys() == load_file(str(root / "draft" / WEIGHTS_NAME)).keys()
    assert all(torch.equal(tensors[k], v) for k, v in load_file(str(root / "draft" / WEIGHTS_NAME)).items())
    assert '"num_speculative_tokens": 3' in (out / "README.md").read_text()
    assert (out / WEIGHTS_NAME).stat().st_mode & 0o777 == 0o644  # it was 0600: unreadable to a server's own user


def test_bad_options_get_one_line_naming_the_option(tiny, tmp_path, export):
    root, _, _ = tiny
    draft, tgt = str(root / "draft"), str(root / "target")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    wide = tmp_path / "wide-target"  # another model's head: 256 x 96 where the draft needs 256 x 64
    _wider_target().save_pretrained(wide)
    last = tmp_path / "last-layer-draft"  # fuses layer 3, the tiny target's last
    save_draft(tiny_draft(tiny[1], block_size=4, layer_ids=[1, 3]), last)
    deeper = tmp_path / "deeper-draft"  # made for a deeper target: reads layer 5 of 8 (it exported without complaint)
    shutil.copytree(root / "draft", deeper)
    config = json.loads((deeper / CONFIG_NAME).read_text())
    config["num_target_layers"] = 8
    config["dflash_config"]["target_layer_ids"][-1] = 5  # as many fused layers (the fc weight's shape), the last deeper
    (deeper / CONFIG_NAME).write_text(json.dumps(config))
    cases = [
        (["--draft", draft, "--for", "vllm", "--out", str(tmp_path / "a")], "--target: needed by --for vllm"),
        (["--draft", draft, "--for", "sglang", "--target", tgt, "--out", str(tmp_path / "b")], "--target: is only used"),
        (["--draft", str(tmp_path / "nowhere"), "--for", "sglang", "--out", str(tmp_path / "c")], "--draft: "),
        (["--draft", str(root), "--for", "sglang", "--out", str(tmp_path / "d")], "--draft: no config.json"),
        (["--draft", draft, "--for", "sglang", "--out", str(full)], "--out: "),
        (["--draft", draft, "--for", "vllm", "--target", str(wide), "--out", str(tmp_path / "e")],
         "--draft: hidden_size 64 does not match the target's hidden_size 96: not a draft for"),
        (["--draft", draft, "--for", "vllm", "--target", str(tmp_path / "nowhere"), "--out", str(tmp_path / "f")],
         "--target: "),
        (["--draft", str(last), "--for", "full-head", "--out", str(tmp_path / "h")],
         "--draft: fuses the target's last layer (3)"),
        (["--draft", str(deeper), "--for", "vllm", "--target", tgt, "--out", str(tmp_path / "i")],
         "--draft: target_layer_ids [5] do not exist in the target (4 layers)"),
    ]
    for argv, message in cases:
        done = export(*argv)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), (argv, done.stderr)
    bad_choice = export("--draft", draft, "--for", "tgi", "--out", str(tmp_path / "g"))
    assert bad_choice.returncode == 2 and bad_choice.stderr.startswith("error: --for: invalid choice: 'tgi'")
    assert "Traceback" not in bad_choice.stderr
    assert not any((tmp_path / n).exists() for n in "abcdefghi")  # nothing written for a refused export


def test_a_truncated_draft_is_one_line_naming_draft(tiny, tmp_path, export):
    """A draft read while `train fit` saved it (or copied in part) was a SafetensorError traceback."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny[0] / "draft", draft)
    with open(draft / WEIGHTS_NAME, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    done = export("--draft", str(draft), "--for", "full-head", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith(
        f"error: --draft: {WEIGHTS_NAME} is unreadable"), done.stderr
    assert not (tmp_path / "out").exists()


def test_a_draft_with_an_absurd_size_is_one_line_naming_the_field(tiny, tmp_path, export):
    """hidden_size 1e9 was torch's "Storage size calculation overflowed" traceback."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny[0] / "draft", draft)
    config = json.loads((draft / CONFIG_NAME).read_text())
    (draft / CONFIG_NAME).write_text(json.dumps({**config, "hidden_size": 10**9}))
    done = export("--draft", str(draft), "--for", "full-head", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --draft: config.json is not a valid DFlash draft config: hidden_size is 1000000000; expected a whole "
        "number in [1, 65536]"], done.stderr
    assert not (tmp_path / "out").exists()


def _wider_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=96, num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True))


# -- docs/deploy.md -------------------------------------------------------------------------------------------------

def front_matter(text: str) -> str:
    return text.split("---\n", 2)[1]


def test_the_deploy_docs_front_matter_is_the_readmes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    deploy = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    shown = re.search(r"```yaml\n---\n(.*?)---\n```", deploy, re.DOTALL).group(1)
    assert shown == front_matter(readme)


@shipped
def test_the_deploy_docs_serving_numbers_follow_the_drafts_block_size():
    """num_speculative_tokens = block size − 1 (vLLM); --speculative-num-draft-tokens = block size (SGLang)."""
    block = json.loads((DEFAULT_DRAFT_DIR / CONFIG_NAME).read_text())["block_size"]
    section = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8").split("## Serving the draft", 1)[1]
    ours = section.split("The same commands serve the large presets", 1)[0]
    assert set(re.findall(r'"num_speculative_tokens": (\d+)', ours)) == {str(block - 1)}
    assert set(re.findall(r"--speculative-num-draft-tokens (\d+)", ours)) == {str(block)}
