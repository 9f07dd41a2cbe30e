"""The cached float32 copy of the GGUF target (dflash.models.target_cache): verified by the size and sha256 recorded when it
was written, made again with a message when damaged, and a cache folder that cannot be written named before the
conversion starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


@pytest.mark.slow
def test_a_damaged_copy_of_the_default_target_is_made_again_with_a_message(tmp_path):
    """A truncated targets/…/model.safetensors was a SafetensorError traceback at every start, never made again."""
    shared = Path(os.environ["DFLASH_CACHE"]) / "targets" / COPY  # the session's copy (made on the first load)
    command = [sys.executable, "-m", "dflash", "generate", "--prompt", "Hi", "--no-draft", "--max-new-tokens", "3",
               "--json"]
    env = {**ENV, "DFLASH_CACHE": str(tmp_path)}
    if target_cache.problem(shared) is None:
        shutil.copytree(shared, tmp_path / "targets" / COPY)
    else:  # none yet: this run makes it
        assert subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=600).returncode == 0
    copy = tmp_path / "targets" / COPY
    size = (copy / "model.safetensors").stat().st_size
    cut(copy / "model.safetensors")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"the cached copy of {COPY}.gguf is damaged (model.safetensors has {size // 2} bytes, {size} were "
            "written): making it again from the GGUF") in proc.stderr
    assert json.loads(proc.stdout)["finish_reason"] == "length"
    assert target_cache.problem(copy) is None and sorted(p.name for p in copy.parent.iterdir()) == [COPY]
