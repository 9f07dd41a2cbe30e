"""Which engine serves which preset: injected engines (tests, notebooks) or lazy loading from the registry.

The default preset uses the trained draft in assets/ when it exists and falls back to the target alone (the
autoregressive baseline) until then, with a notice the UI shows. Large presets need a CUDA machine.

Loading for visitors (`for_request`) is bounded, because a load runs inside the server's single engine slot and
cannot be interrupted once it has started (from_pretrained and hub downloads have no cancel point):
- the operator chooses what may be loaded at all (`DFLASH_PRESETS`, see `offered_presets`; the default preset
  only, when unset), so the worst single load is the largest preset the operator offers;
- one load at a time: a visitor's load is refused (BusyError) while another one runs, never queued behind it;
- the load's time counts against the request's deadline (a load that used it all refuses the request; the
  model stays loaded for the next one);
- a load that would swap out a loaded large preset is refused within `swap_interval_s` of the previous load,
  so alternating visitors cannot keep the slot busy with loads.
Memory: the default plus at most one large preset; a swapped-out engine is dropped and collected (its target's
capture hooks form reference cycles) and, on CUDA, its cached blocks are returned before the next load.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from dflash.decode.engine import Engine
from dflash.errors import BusyError, ModelLoadError, ValidationError
from dflash.loading.registry import PRESETS, draft_block_size, get_preset
from dflash.decode.request import Request
from . import torch_thread
from .text import NO_DRAFT_NOTICE, draft_folder, draft_notice, local_draft_notice

log = logging.getLogger("dflash.ui")

Loader = Callable[[str], tuple[Engine, str]]  # preset name → (engine, notice shown in the UI, "" for none)
Twin = Callable[[str, str, Engine], Engine]  # (preset, dtype, its engine) → the same models in that dtype

PRESETS_ENV = "DFLASH_PRESETS"  # the operator's list of presets visitors may load
SWAP_INTERVAL_S = 300.0  # the registry loader's least time between two swaps of the large model


def offered_presets(setting: str | None, cuda: bool) -> list[str]:
    """The presets visitors may load, from the operator's `DFLASH_PRESETS`: unset or empty → the default only;
    "all" → every preset this host can run; else comma-separated registry names. The default is always offered.
    ValidationError names DFLASH_PRESETS for an unknown name, or a GPU preset on a host without CUDA."""
    names = [n.strip() for n in (setting or "").split(",") if n.strip()]
    if names == ["all"]:
        return [p for p in PRESETS if cuda or not PRESETS[p].gpu_recommended]
    for name in names:
        if name not in PRESETS:
            raise ValidationError(PRESETS_ENV, f"unknown preset {name!r}; choose from {', '.join(PRESETS)} (or all)")
        if PRESETS[name].gpu_recommended and not cuda:
            raise ValidationError(PRESETS_ENV, f"preset {name!r} needs a CUDA GPU; this host has none")
    return [p for p in PRESETS if p == "default" or p in names]


def load_preset(name: str, default_draft: str | None = None, **fixed: Any) -> tuple[Engine, str]:
    """The app's loader: registry presets only; the default falls back to no draft while none is trained.
    default_draft: the operator's draft directory for the default target (`dflash-playground --draft`), instead of
    the shipped one; it must exist (no fallback: the operator asked for that draft). fixed: load_engine's dtype and
    threads, for the numerics switch's second engine (`EngineProvider.engine`)."""
    from dflash.loading.load import default_draft_available, load_engine

    preset = get_preset(name)
    if preset.gpu_recommended and not torch.cuda.is_available():
        raise ModelLoadError(f"preset {name!r} needs a CUDA GPU and Hugging Face hub access; this server has no GPU")
    if name == "default" and default_draft is not None:
        engine, _ = load_engine(name, draft=default_draft, **fixed)
        # Each run's hardware line and trace name the operator's draft: "default" alone reads as the shipped one.
        engine.name = engine.target.name = f"{name} with draft {draft_folder(default_draft)}"
        return engine, local_draft_notice(default_draft)
    if name == "default" and not default_draft_available(preset.draft):
        engine, _ = load_engine(name, no_draft=True, **fixed)
        return engine, NO_DRAFT_NOTICE
    engine, _ = load_engine(name, **fixed)
    return engine, (draft_notice(Path(preset.draft) / "evaluation.json") if name == "default" else "")


def dtype_name(engine: Engine) -> str:
    return engine.target.numerics


def offered_dtypes(engine: Engine) -> list[str]:
    """The numerics a visitor may choose for `engine`: on a CPU whose settings were chosen for the host, float32
    (exact) always, bfloat16 (fast) where the host chose it or computes it natively (avx512_bf16 / amx_bf16:
    emulated bfloat16 is slower than float32, so not worth offering), and int4 where the probe timed it (the target's
    GGUF has Q4_1 layers); elsewhere only the engine's own."""
    from dflash.loading.host import cpu_flags

    own = dtype_name(engine)
    if engine.host is None:
        return [own]
    native = own == "bfloat16" or bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))
    int4 = own == "int4" or any(row.get("dtype") == "int4" for row in engine.host.candidates)  # the target has them
    return ["float32"] + ["bfloat16"] * native + ["int4"] * int4


def load_twin(name: str, dtype: str, engine: Engine, default_draft: str | None = None) -> Engine:
    """The registry loader's `Twin`: the preset loaded again in `dtype` with the threads the host probe chose for
    `engine` (the layout is then probed once for that dtype and cached, like the first choice)."""
    threads = engine.host.threads if engine.host is not None else None
    return load_preset(name, default_draft, dtype=dtype, threads=threads)[0]


def wait_until_free(engine: Engine, cancel: threading.Event, deadline_s: float | None) -> None:
    """Wait while `engine` runs a request that came from outside the queue (a notebook, a script); BusyError when
    Stop is pressed meanwhile or the wait outlasts `deadline_s`. Waits on the caller's thread, never on the torch
    thread, which the run holding the engine needs to finish."""
    start = time.monotonic()
    while engine.busy:
        if cancel.wait(0.05):
            raise BusyError("stopped while waiting for the engine, which another request was using")
        if deadline_s is not None and time.monotonic() - start > deadline_s:
            raise BusyError(f"the engine stayed busy with another request for the deadline of {deadline_s:g} s")


class EngineProvider:
    """`get(preset)` → Engine. Built from a dict of ready engines, or a loader called on first use.

    offered: the presets visitors may load besides the default (None: `DFLASH_PRESETS` for the registry loader,
    every registry preset for a given loader, the given engines for a dict). swap_interval_s: see the module
    docstring (None: SWAP_INTERVAL_S for the registry loader, 0 otherwise). default_draft: the registry loader's
    draft directory for the default preset (None: the shipped draft)."""

    def __init__(self, engines: Mapping[str, Engine] | Loader | None = None, notices: Mapping[str, str] | None = None,
                 *, offered: Iterable[str] | None = None, swap_interval_s: float | None = None,
                 default_draft: str | None = None, twin: Twin | None = None):
        self._engines: dict[str, Engine] = {}
        self._twins: dict[tuple[str, str], Engine] = {}  # (preset, dtype) → the preset in other numerics
        self._twin = twin
        self._notices: dict[str, str] = dict(notices or {})
        self._loader: Loader | None = None
        self._default_draft = default_draft if engines is None else None
        if engines is None:
            self._loader = functools.partial(load_preset, default_draft=default_draft)
            self._twin = twin or functools.partial(load_twin, default_draft=default_draft)
            if offered is None:
                offered = offered_presets(os.environ.get(PRESETS_ENV), torch.cuda.is_available())
            swap_interval_s = SWAP_INTERVAL_S if swap_interval_s is None else swap_interval_s
        elif callable(engines) and not isinstance(engines, Mapping):
            self._loader = engines
        else:
            self._engines = dict(engines)
        if self._loader is None:
            names = list(self._engines)
        else:
            names = list(PRESETS) if offered is None else ["default", *offered]
        self._offered = [p for p in PRESETS if p in names] + [p for p in names if p not in PRESETS and p in self._engines]
        self.swap_interval_s = swap_interval_s or 0.0
        self._last_load = -float("inf")  # time.monotonic() when the last load ended
        self._lock = threading.Lock()  # held for a whole load: one at a time

    @property
    def presets(self) -> list[str]:
        """Dropdown choices: the offered presets, in registry order."""
        return list(self._offered)

    def loaded(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def notice(self, name: str) -> str:
        return self._notices.get(name, "")

    def block_size(self, name: str) -> int | None:
        """The preset's draft block size, for the sliders: the loaded engine's draft (None without one), else the
        registry's for a preset not loaded yet."""
        engine = self._engines.get(name)
        if engine is not None:
            return engine.trained_block_size
        if name == "default" and self._default_draft is not None:
            return draft_block_size(dataclasses.replace(PRESETS[name], draft=self._default_draft))
        return draft_block_size(PRESETS[name]) if name in PRESETS else None

    def check(self, name: Any) -> None:
        """ValidationError naming `preset` unless visitors may have `name`. Loads nothing."""
        if not isinstance(name, str):
            raise ValidationError("preset", "must be a preset name")
        if name not in self._offered:
            choices = ", ".join(self._offered)
            if name not in PRESETS:
                raise ValidationError("preset", f"unknown preset {name!r}; choose one of {choices}")
            raise ValidationError("preset", f"{name!r} is not offered on this server; choose one of {choices}")

    def get(self, name: Any, visitor: bool = False) -> Engine:
        """The preset's engine, loaded on first use. visitor: refuse (BusyError) instead of waiting for another
        load, or when the load would swap out a model loaded less than `swap_interval_s` ago."""
        return self._get(name, visitor)[0]

    def numerics(self, name: str) -> tuple[str, list[str]]:
        """(the preset's own dtype, the dtypes a visitor may choose); ("", []) while it is not loaded. Other numerics
        than its own need a `twin` loader."""
        engine = self._engines.get(name)
        if engine is None:
            return "", []
        own = dtype_name(engine)
        return own, offered_dtypes(engine) if self._twin is not None else [own]

    def for_request(self, name: Any, request: Request, dtype: Any = None) -> tuple[Engine, Request]:
        """A visitor's engine for an already validated request (loaded under the visitor rules, its load time
        taken from the request's deadline) and the request fitted to it: no draft in the engine → none asked.
        dtype: the numerics switch (None or "": the preset's own), ValidationError naming `numerics` unless offered."""
        start = time.monotonic()
        engine, loaded_now = self._get(name, visitor=True)
        if dtype not in (None, "", dtype_name(engine)):
            engine, twin_now = self._get_twin(name, dtype)
            loaded_now = loaded_now or twin_now
        spent = time.monotonic() - start
        changes: dict[str, Any] = {"use_draft": request.use_draft and engine.drafter is not None}
        if loaded_now and request.deadline_s is not None:
            if spent >= request.deadline_s:
                raise ModelLoadError(f"preset: loading {name!r} took {spent:.1f} s, longer than the request's deadline "
                                     f"of {request.deadline_s:g} s; it is loaded now, so send the request again")
            changes["deadline_s"] = request.deadline_s - spent
        return engine, dataclasses.replace(request, **changes)

    def _get(self, name: Any, visitor: bool) -> tuple[Engine, bool]:
        """(engine, whether this call loaded it)."""
        self.check(name)
        if name in self._engines:
            return self._engines[name], False
        if not self._lock.acquire(blocking=not visitor):
            raise BusyError("preset: another model is being loaded on this server; try again in a minute"
                            + self._loaded_hint(name))
        try:
            if name in self._engines:  # loaded by the call this one waited for
                return self._engines[name], False
            return self._load(name, visitor), True
        finally:
            self._lock.release()

    def _get_twin(self, name: str, dtype: Any) -> tuple[Engine, bool]:
        """The preset in numerics `dtype` (loaded on first use, one load at a time), and whether this call loaded it."""
        own, offered = self.numerics(name)
        if dtype not in offered:
            raise ValidationError("numerics", f"must be one of {', '.join(offered)} for preset {name!r}, got {dtype!r}")
        if (name, dtype) in self._twins:
            return self._twins[name, dtype], False
        if not self._lock.acquire(blocking=False):
            raise BusyError("numerics: another model is being loaded on this server; try again in a minute")
        try:
            if (name, dtype) not in self._twins:
                log.info("loading preset %s in %s", name, dtype)
                self._twins[name, dtype] = torch_thread.call(self._twin, name, dtype, self._engines[name])
                return self._twins[name, dtype], True
            return self._twins[name, dtype], False
        finally:
            self._lock.release()

    # -- loading ----------------------------------------------------------------------------------------------
    def _load(self, name: str, visitor: bool) -> Engine:
        """Load `name` (the lock is held). Keeps the default plus at most one large model in memory."""
        if self._loader is None:  # check() passed, so this is a given engine that is gone: cannot happen
            raise ModelLoadError(f"preset {name!r} is not loaded on this server")
        evicted = [] if name == "default" else [k for k in self._engines if k != "default"]  # loaded beside the rest
        since = time.monotonic() - self._last_load
        if visitor and evicted and since < self.swap_interval_s:
            raise BusyError(f"preset: the server switched models {since:.0f} s ago and switches at most every "
                            f"{self.swap_interval_s:.0f} s; use {', '.join(evicted)} or try again in "
                            f"{self.swap_interval_s - since:.0f} s")
        self._drop(evicted)
        log.info("loading preset %s", name)
        engine, notice = torch_thread.call(self._loader, name)  # where the engine will run (ui/torch_thread.py)
        self._engines[name], self._notices[name] = engine, notice
        self._last_load = time.monotonic()
        return engine

    def _drop(self, names: list[str]) -> None:
        """Forget these engines and give their memory back now, not at some later garbage collection: the target's
        capture hooks (model → hook → Target → model) are a reference cycle that reference counting never frees."""
        if not names:
            return
        for name in names:
            del self._engines[name]
        self._twins = {k: e for k, e in self._twins.items() if k[0] not in names}
        gc.collect()
        if torch.cuda.is_initialized():  # not in ZeroGPU's main process, where CUDA is only emulated
            torch.cuda.empty_cache()  # hand the freed blocks back to the device, for the next load (or other processes)
        log.info("dropped preset(s) %s", ", ".join(names))

    def _loaded_hint(self, name: str) -> str:
        ready = [k for k in self._engines if k != name]
        return f" (or use {', '.join(ready)}, loaded already)" if ready else ""
