"""The engine's verification calls: on CUDA the Triton kernels or the PyTorch reference, whichever is faster there;
the reference elsewhere.

`match_verify` and `speculative_verify` return `dflash.verification.verify.Outcome`, whichever backend ran. The reference is
`dflash.verification.verify` itself (the specification of the kernels), so on CPU the engine's behaviour is bit-identical to
calling `dflash.verification.verify` directly. The kernels live in `dflash.kernels`, which imports no other `dflash` module:
imports run engine → `dflash.decode.step` → this module → `dflash.verification.verify` / `dflash.kernels`.

Backend choice, per call, from the device of the target logits:
- `DFLASH_KERNELS=auto` (default): on CUDA tensors, when `triton` imports, the faster of the two on this machine:
  the first call of each kind (rule, sampling filters, rows, vocabulary, dtype, device) times both on its inputs
  and that choice holds for later calls of the kind (`MEASURED` keeps the timings). Measured, not assumed: on an
  H200 (torch 2.11, Triton 3.6) the reference was faster per call at vocabularies 49,152 and 151,936
  (results/gpu/); another GPU or Triton version may differ. The reference otherwise (CPU, or no Triton).
- `DFLASH_KERNELS=reference`: always the reference (e.g. to compare a run with kernels on and off).
- `DFLASH_KERNELS=triton`: insist on Triton; on CPU tensors this needs `TRITON_INTERPRET=1` (Triton's
  interpreter, for tests), and without Triton it raises instead of falling back.
The kernel modules are imported lazily, so importing this module never imports Triton.
"""

from __future__ import annotations

import functools
import importlib
import os
import statistics
import time
from collections.abc import Callable

import torch

from dflash.verification import verify
from dflash.errors import ValidationError
from dflash.verification.verify import Outcome, check_draft_ids

MODES = ("auto", "triton", "reference")
# DFLASH_KERNELS=auto on CUDA: (rule, filters, device, dtype, rows, vocabulary) -> {"triton_us", "reference_us", "chosen"}
MEASURED: dict[tuple, dict] = {}


@functools.cache
def triton_importable() -> bool:
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception:  # noqa: BLE001 — a broken install (missing driver libs, wrong arch) counts as absent
        return False
    return True


def mode() -> str:
    value = os.environ.get("DFLASH_KERNELS", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValidationError("DFLASH_KERNELS", f"must be one of {', '.join(MODES)}, got {value!r}")
    return value


def backend(device: torch.device | str) -> str:
    """'triton' or 'reference' for tensors on `device`, following DFLASH_KERNELS (see the module doc). The one check
    of that variable: `dflash.loading.load.load_engine` calls it for the engine's device before anything loads, so a value
    this machine cannot honour is a ValidationError naming DFLASH_KERNELS at start, not at every verification."""
    device = torch.device(device)
    chosen = mode()
    if chosen == "reference":
        return "reference"
    if not triton_importable():
        if chosen == "triton":
            raise ValidationError("DFLASH_KERNELS", "triton, but triton cannot be imported (pip install triton)")
        return "reference"
    if device.type == "cuda" and torch.cuda.is_available():
        return "triton"
    if chosen == "triton":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "triton"
        raise ValidationError("DFLASH_KERNELS", f"triton on a {device.type} device needs TRITON_INTERPRET=1 (Triton's "
                                                "interpreter, slow); use auto or reference")
    return "reference"


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_us(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """The median of `reps` synchronised calls of `fn`, in µs (also dflash.bench.host_work's timer)."""
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def measured_choice(kind: tuple, device: torch.device, kernel: Callable[[], Outcome], reference: Callable[[], Outcome],
                    reps: int = 5) -> Callable[[], Outcome]:
    """The faster of `kernel` and `reference` (the same verification on the same inputs) for calls of `kind`: timed
    once, after a warm-up call of each (the kernel compiles there), then `MEASURED[kind]` decides."""
    if kind not in MEASURED:
        kernel(), reference()
        us = {"triton": median_us(kernel, device, reps), "reference": median_us(reference, device, reps)}
        MEASURED[kind] = {"triton_us": round(us["triton"], 1), "reference_us": round(us["reference"], 1),
                          "chosen": min(us, key=us.get)}
    return kernel if MEASURED[kind]["chosen"] == "triton" else reference


def _run(rule: str, logits: torch.Tensor, kernel: Callable[[], Outcome], reference: Callable[[], Outcome],
         filters: tuple) -> Outcome:
    """One verification through the backend `backend` names; auto on CUDA: the measured faster one."""
    if backend(logits.device) == "reference":
        return reference()
    if mode() == "triton" or logits.device.type != "cuda":
        return kernel()
    kind = (rule, *filters, str(logits.device), str(logits.dtype).removeprefix("torch."), *logits.shape)  # rows, V
    return measured_choice(kind, logits.device, kernel, reference)()


def match_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, gumbel: torch.Tensor | None = None, acceptance_threshold: float = 1.0) -> Outcome:
    """The *match* rule (greedy / Gumbel-max / relaxed), as `dflash.verification.verify.match_verify`.

    draft_tokens [n] long; target_logits [n+1, V]; gumbel [n+1, V] or None.
    """
    args = (draft_tokens, target_logits, temperature, top_k, top_p, gumbel, acceptance_threshold)
    sampled = temperature > 0.0 and gumbel is not None
    filters = ("sampled" if sampled else "greedy", sampled and (top_k > 0 or top_p < 1.0), acceptance_threshold < 1.0)
    return _run("match", target_logits, lambda: _match_triton(*args), lambda: verify.match_verify(*args), filters)


def _match_triton(draft_tokens: torch.Tensor, target_logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                  gumbel: torch.Tensor | None, acceptance_threshold: float) -> Outcome:
    from dflash.kernels.greedy_verify_triton import match_verify_batched

    d = draft_tokens.to(target_logits.device)
    check_draft_ids(d, target_logits.shape[-1])
    n = d.shape[0]
    acc, nxt, targets, relaxed = match_verify_batched(
        d[None], target_logits[None], temperature, top_k, top_p, None if gumbel is None else gumbel[None],
        acceptance_threshold)
    flat = torch.cat([acc, nxt, targets[0], relaxed[0].long()]).tolist()  # one copy to the host
    a = flat[0]
    return Outcome(a, flat[1], flat[2: n + 3], [bool(v) for v in flat[n + 3: n + 3 + a]])


def speculative_verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                       temperature: float, top_k: int, top_p: float, uniforms: list[float] | torch.Tensor,
                       gumbel: torch.Tensor) -> Outcome:
    """Lossless speculative sampling from the target's logits (temperature, top-k, top-p applied here).

    draft_tokens [n] drawn from draft_probs q [n, V]; target_logits [n+1, V]; uniforms n floats in [0, 1);
    gumbel [n+1, V]. As `dflash.verification.verify.speculative_verify`.
    """
    args = (draft_tokens, draft_probs, target_logits, temperature, top_k, top_p, uniforms, gumbel)
    if draft_tokens.shape[0] == 0:
        return verify.speculative_verify(*args)
    return _run("rejection", target_logits, lambda: _speculative_triton(*args), lambda: verify.speculative_verify(*args),
                (top_k > 0 or top_p < 1.0,))


def _speculative_triton(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor,
                        temperature: float, top_k: int, top_p: float, uniforms: list[float] | torch.Tensor,
                        gumbel: torch.Tensor) -> Outcome:
    from dflash.kernels.spec_sample_triton import speculative_verify_batched

    dev = target_logits.device
    d = draft_tokens.to(dev)
    check_draft_ids(d, target_logits.shape[-1])
    u = torch.as_tensor(uniforms, dtype=torch.float64).to(dev)
    acc, nxt, targets = speculative_verify_batched(d[None], draft_probs[None], target_logits[None], temperature, top_k,
                                                   top_p, u[None], gumbel[None])
    flat = torch.cat([acc, nxt, targets[0]]).tolist()
    return Outcome(flat[0], flat[1], flat[2:], [False] * flat[0])
