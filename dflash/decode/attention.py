"""What the draft attends to: a bounded summary of its attention weights over one drafted block.

The draft's keys and values are the injected target context (the fused target hidden states of the committed
positions 0 .. C-1) followed by the block's own (the anchor, then the masked slots). For each draft layer, averaged
over heads, each block slot keeps its `top_k` context positions with their weights and its whole row over the block;
per head only the share of the slot's attention that goes to the context. Plain types only: it rides in
`events.DraftStep.attention` and in traces (ui/trace_schema.py checks it).

Asked for per request (`Request.trace_attention`); a request that does not ask runs no extra work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TOP_K = 16  # context positions kept per slot and layer
MAX_TOP_K = 64  # the most a trace may hold (ui/trace_schema.py)
DIGITS = 4  # weights are rounded: a trace holds what the eye can see


def summarize(weights: list[torch.Tensor], anchor: int, top_k: int = TOP_K) -> dict[str, Any]:
    """Per-layer weights [1, nh, b, C + b] (`DFlashDraftModel.forward(attention=…)`) → the summary.

    Keys: anchor (absolute position of block slot 0), context_len (C), top_k, heads, ctx_positions (the context
    positions some slot keeps, ascending; `with_texts` adds their texts), and layers: one dict per draft layer with,
    per block slot, ctx_pos / ctx_w (top-k context positions, heaviest first, and their weights), ctx_share (weight
    on the whole context), block (weights over the b block slots), and head_ctx_share (per head, per slot)."""
    b = weights[0].shape[2]
    ctx_len = weights[0].shape[3] - b
    k = min(top_k, ctx_len)
    layers, kept = [], set()
    for w in weights:
        w = w[0].float()  # [nh, b, C + b]
        mean = w.mean(0)  # [b, C + b]
        top_w, top_i = mean[:, :ctx_len].topk(k, dim=-1)  # [b, k], heaviest first
        kept.update(top_i.flatten().tolist())
        layers.append({"ctx_pos": top_i.tolist(), "ctx_w": _rounded(top_w),
                       "ctx_share": _rounded(mean[:, :ctx_len].sum(-1)), "block": _rounded(mean[:, ctx_len:]),
                       "head_ctx_share": _rounded(w[:, :, :ctx_len].sum(-1))})
    return {"anchor": anchor, "context_len": ctx_len, "top_k": k, "heads": weights[0].shape[1],
            "ctx_positions": sorted(kept), "ctx_texts": [], "layers": layers}


def _rounded(t: torch.Tensor) -> list:
    return t.double().round(decimals=DIGITS).tolist()  # float64: 0.0545 stays 0.0545 in JSON


def with_texts(summary: dict[str, Any], seq: list[int], texts: Callable[[list[int]], list[str]]) -> dict[str, Any]:
    """The summary with the text of each kept context position (`seq`: the request's prompt and output ids)."""
    return {**summary, "ctx_texts": texts([seq[p] for p in summary["ctx_positions"]])}
