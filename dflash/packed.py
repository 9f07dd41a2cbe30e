"""The CPU fast path for the LM head: a oneDNN pre-packed copy of the weight for multi-row products.

Used by `Target.forward` (the verify of a block) and by the drafter (the draft's positions); measurements in
BENCHMARKS.md ("A pre-packed LM head for multi-row products"), A/B runs with `python -m dflash.bench.profile`.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F


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
