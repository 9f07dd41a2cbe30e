"""Hugging Face Spaces support: the ZeroGPU decorator.

ZeroGPU (Hugging Face's shared-GPU Spaces hardware). A `@spaces.GPU` function runs in a forked worker that holds
the GPU until the function returns (generators: until they end), and everything it returns or yields is pickled
across a queue. So the UI should *record* a generation on the GPU and *animate* it outside:

    from dflash.loading.zerogpu import duration_for, gpu_decorator, zero_gpu

    engine, info = load_engine(device="cuda" if zero_gpu() else None)   # module level: ZeroGPU emulates CUDA

    @gpu_decorator(duration=lambda request: duration_for(request.max_new_tokens))
    def record(request: Request) -> list[dict]:
        return [event_to_dict(e) for e in engine.stream(request)]       # plain Python objects, no tensors

    def run(...):                                                       # the Gradio handler, not decorated
        events = record(Request(...))
        for event in events: ... yield HTML / figures (sleep for the animation here, never on the GPU)

Off Spaces (or without the `spaces` package) `gpu_decorator` returns the function unchanged, so the same app
runs locally; on a Space without ZeroGPU hardware `spaces.GPU` itself is a no-op.

Two properties of the worker shape the code around such a function. It is forked at the first call and reused
for later ones, so it holds this process's state as of that first call: pass it keys it can resolve by itself
(a preset name it can load), never an object registered after the fork. And an exception raised in it reaches
the caller as a generic "ZeroGPU worker error" naming only the exception's class (only `gr.Error` keeps its
message), after the GPU time is spent: validate the request before the call.
"""

from __future__ import annotations

import os
from typing import Any, Callable


def on_spaces() -> bool:
    """True inside a Hugging Face Space (the platform sets SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def zero_gpu() -> bool:
    """True on ZeroGPU hardware (the `spaces` package reads the same variable)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


def duration_for(max_new_tokens: int, base_s: float = 15.0, per_token_s: float = 0.05, cap_s: int = 120) -> int:
    """Seconds of GPU to ask ZeroGPU for: shorter requests get better queue priority (default there is 60)."""
    return int(min(cap_s, base_s + per_token_s * max(0, int(max_new_tokens))))


def gpu_decorator(fn: Callable | None = None, *, duration: int | Callable[..., int] = 60, **gpu_kwargs: Any):
    """`spaces.GPU(duration=..., **gpu_kwargs)(fn)` on a Space with the `spaces` package, else `fn` unchanged.

    Use as `@gpu_decorator` or `@gpu_decorator(duration=...)`; `duration` may be a callable taking the same
    arguments as `fn` (ZeroGPU's dynamic duration). Coroutine functions are not supported by ZeroGPU.
    """

    def wrap(func: Callable) -> Callable:
        if not on_spaces():
            return func
        try:
            import spaces  # noqa: PLC0415 — imported only on a Space: on ZeroGPU it patches torch at import
        except ImportError:
            return func
        return spaces.GPU(duration=duration, **gpu_kwargs)(func)

    return wrap(fn) if fn is not None else wrap
