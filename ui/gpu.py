"""The playground on ZeroGPU: a whole run is recorded in the GPU worker as a list of events (plain dataclasses,
cheap to pickle), then animated in this process, outside the GPU allocation.

The worker is a fork of this process made at the first GPU call and reused after. So it is handed a key it can
resolve by itself, (provider number, preset name), never an engine object: providers are registered when a
Playground is built (the app builds its one at startup, before any GPU call), so every worker holds them, and
the worker's copy of a provider loads, there, a preset that was loaded here only after the fork. The visitor
rules of a load (which presets, one at a time, the deadline, the swap interval: ui/engines.py) were applied here,
in this process, before the call, so the worker loads without them; a swap there frees the old engine the same
way. No engine is kept by this module: the providers are held weakly and the keys are plain values.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator

from dflash.decode.engine import Engine
from dflash.decode.request import Request
from dflash.loading.zerogpu import duration_for, gpu_decorator
from .engines import EngineProvider

_PROVIDERS: weakref.WeakValueDictionary[int, EngineProvider] = weakref.WeakValueDictionary()
_numbers = itertools.count()


def register(provider: EngineProvider) -> int:
    """The number by which the GPU worker finds `provider`."""
    number = next(_numbers)
    _PROVIDERS[number] = provider
    return number


def gpu_seconds(key: tuple[int, str], request: Request) -> int:
    return duration_for(request.max_new_tokens)


def record(key: tuple[int, str], request: Request) -> list:
    """The whole run as a list of events. key: (provider number, preset name)."""
    provider, preset = key
    return list(_PROVIDERS[provider].get(preset).stream(request))


record_on_gpu = gpu_decorator(duration=gpu_seconds)(record)


def recorded_stream(engine: Engine, key: tuple[int, str], request: Request) -> Iterator:
    """The run of `request` recorded on the GPU, as a generator of events (like engine.stream; the handlers
    close it). Validated here first: a bad value must cost no GPU time, and an error raised in the worker reaches
    the user only as its class name."""
    engine.validate(request)
    recorded = record_on_gpu(key, request)
    return (e for e in recorded)
