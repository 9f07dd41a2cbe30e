"""CPU fast paths for the target's matmuls with few rows (a verify of a block, the draft's positions):
`PackedLinear`, a oneDNN pre-packed copy of the LM head, and `TransposedLinear`, the decoder's linear layers with
pre-transposed weights (chosen per host by dflash.loading.host).

Measurements in BENCHMARKS.md ("A pre-packed LM head for multi-row products"); A/B runs with
`python -m dflash.bench.profile`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


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


class TransposedLinear(nn.Module):
    """`x @ W.T` computed as `x @ Wt` with Wt = W.T stored contiguous [in, out]: a linear layer of the target's
    decoder in the layout the host's matmul handles best for few rows.

    On some CPUs F.linear (W [out, in], an "NT" product) leaves MKL's fast small-M path at 4 rows and becomes
    several times slower than one row, while the same product from a pre-transposed weight stays close to the
    one-row cost; `python -m dflash.bench.profile layout` measures both. The host probe (dflash.loading.host) chooses the
    layout per machine; `linear` (the module it replaced) stays reachable to swap back.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)  # [in, out]
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] → [..., out]
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias

    def to_linear(self) -> nn.Linear:
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta",
                        dtype=self.weight_t.dtype)  # meta: no initialisation of weights replaced on the next line
        lin.weight = nn.Parameter(self.weight_t.detach().t().contiguous(), requires_grad=False)
        lin.bias = self.bias
        return lin


LAYOUTS = ("linear", "transposed")


def set_layout(layers: nn.Module, layout: str) -> int:
    """Put every linear layer under `layers` (the decoder's layers, not the LM head) in `layout`; returns how many
    changed. Idempotent, and reversible: a weight goes through one exact transpose each way."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    changed = 0
    for module in list(layers.modules()):
        for name, child in list(module.named_children()):
            if layout == "transposed" and type(child) is nn.Linear:
                setattr(module, name, TransposedLinear(child))
            elif layout == "linear" and type(child) is TransposedLinear:
                setattr(module, name, child.to_linear())
            else:
                continue
            changed += 1
    return changed


class LayoutSwitch:
    """Both layouts of `layers`' linear weights held at once, so switching is a pointer swap, not a copy of every
    weight: what lets the host probe interleave its timings of the two (the decoder's weights are held twice until
    the switch is dropped)."""

    def __init__(self, layers: nn.Module):
        self.slots = [(parent, name) for parent in layers.modules() for name, child in parent.named_children()
                      if type(child) in (nn.Linear, TransposedLinear)]
        self.current = layout_of(layers)
        self.built = {self.current: [getattr(parent, name) for parent, name in self.slots]}

    def set(self, layout: str) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout: must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if layout not in self.built:
            here = self.built[self.current]
            self.built[layout] = [TransposedLinear(m) if layout == "transposed" else m.to_linear() for m in here]
        for (parent, name), module in zip(self.slots, self.built[layout], strict=True):
            setattr(parent, name, module)
        self.current = layout


def layout_of(layers: nn.Module) -> str:
    return "transposed" if any(type(m) is TransposedLinear for m in layers.modules()) else "linear"


class Float32Matmul(nn.Module):
    """A low-precision linear layer of the decoder (`nn.Linear` or `TransposedLinear`) computed in float32, its
    weight cast on every call; the output is cast back, so the rest of the model runs as before.

    On a CPU without native bfloat16 (AVX2, AVX-512 without AVX512_BF16) a bfloat16 product costs about the same per
    row however many rows it has, so a prompt's prefill runs several times slower than in float32, while casting the
    weight is a fixed cost per call (it reads and writes every weight once): over a whole forward it pays from about
    16 rows on (dflash.loading.probe.FLOAT32_ROWS). The weights' values are the model's own (bfloat16), only the products are
    accumulated in float32. `dflash.loading.host` decides per machine whether it pays.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] → [..., out], x's dtype
        m = self.inner
        if type(m) is TransposedLinear:
            y = torch.matmul(x.float(), m.weight_t.float())
        else:
            y = F.linear(x.float(), m.weight.float())
        return (y if m.bias is None else y + m.bias.float()).to(x.dtype)


@contextmanager
def float32_matmuls(layers: nn.Module):
    """Inside the block every linear layer under `layers` runs as `Float32Matmul`; put back on exit."""
    slots = [(parent, name, child) for parent in layers.modules() for name, child in parent.named_children()
             if type(child) in (nn.Linear, TransposedLinear)]
    for parent, name, child in slots:
        setattr(parent, name, Float32Matmul(child))
    try:
        yield
    finally:
        for parent, name, child in slots:
            setattr(parent, name, child)
