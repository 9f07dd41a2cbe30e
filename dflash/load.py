"""Build an Engine from a preset name or explicit target/draft locations."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from dflash.draft import CONFIG_NAME, WEIGHTS_NAME, load_draft
from dflash.engine import Engine
from dflash.errors import ModelLoadError
from dflash.registry import get_preset
from dflash.target import Target, gpu_load_options, load_target_model, pick_device, pick_dtype


def resolve_draft_dir(source: str) -> Path:
    """A local directory, or a hub id resolved through the local cache (then online) — safetensors + json only."""
    if Path(source).is_dir():
        return Path(source)
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise ModelLoadError(f"draft: directory {source} not found (the default draft not trained yet? use --no-draft)")
    from huggingface_hub import snapshot_download

    patterns = [CONFIG_NAME, "*.safetensors"]
    try:
        return Path(snapshot_download(source, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 — not cached: try online unless offline mode
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelLoadError(f"draft: {source} is not in the local hub cache and HF_HUB_OFFLINE=1") from None
    try:
        return Path(snapshot_download(source, allow_patterns=patterns))
    except Exception:  # noqa: BLE001
        raise ModelLoadError(f"draft: cannot fetch {source}: not a local directory, not cached, hub unreachable") from None


def default_draft_available(path: str | None) -> bool:
    return path is not None and (Path(path) / WEIGHTS_NAME).is_file()


def load_engine(preset: str | None = "default", target: str | None = None, draft: str | None = None,
                no_draft: bool = False, dtype: str | None = None, device: str | None = None,
                threads: int | None = None, quantize: str | None = None,
                device_map: str | None = None) -> tuple[Engine, dict]:
    """Returns (engine, info) where info has load times and what was loaded.

    CUDA only: quantize "4bit" | "8bit" loads the target with bitsandbytes; device_map "auto" splits a target
    larger than one GPU over the visible GPUs with accelerate (the draft stays on the first one).
    """
    if threads:
        torch.set_num_threads(threads)
    if target is None:
        p = get_preset(preset or "default")
        target, draft = p.target, (draft or p.draft)
        name = p.name
    else:
        name = Path(target).name or target
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    options = gpu_load_options(dev, dt, quantize, device_map)  # {} on CPU; errors name the option
    t0 = time.perf_counter()
    model, tokenizer = load_target_model(target, **options)
    tgt = Target(model, tokenizer, name=name, device=dev, dtype=dt)
    info = {"target": target, "target_load_s": time.perf_counter() - t0, "device": str(tgt.device), "dtype": str(dt).removeprefix("torch.")}
    if quantize:
        info["quantize"] = quantize
    if getattr(model, "hf_device_map", None) and device_map:
        info["device_map"] = sorted({str(v) for v in model.hf_device_map.values()})
    dmodel = vocab = None
    if draft and not no_draft:
        t0 = time.perf_counter()
        dmodel, vocab = load_draft(resolve_draft_dir(draft))
        info.update(draft=draft, draft_load_s=time.perf_counter() - t0)
    return Engine(tgt, dmodel, vocab, name=name), info
