"""Pure render function for what the draft attends to (`DraftStep.attention`, dflash/decode/attention.py), shown under
the block inspector for the inspected block: per draft layer, averaged over heads, each block slot's most attended
context tokens (shaded by weight) and its weights over the block itself, the anchor marked; a run that did not record
it shows nothing. Every text from the trace is escaped.
"""

from __future__ import annotations

from dflash.decode import events as ev

from .render import attr, quoted, show_text
from .run_state import BlockInfo

WHY = ("The draft's keys and values include the target's hidden states of every committed token (KV injection): each "
       "row shows where one block slot looks, in that injected context and in its own block.")
RGB = "213,94,0"  # Okabe-Ito vermillion: the attention weights (the inspector's blue is the draft's confidence)


def traced_step(info: BlockInfo) -> ev.DraftStep | None:
    """The block's latest denoising step that recorded its attention, or None."""
    return next((s for s in reversed(info.steps) if s.attention), None)


def attention_html(info: BlockInfo) -> str:
    """The view for one block ("" when its steps recorded no attention)."""
    step = traced_step(info)
    if step is None:
        return ""
    a = step.attention
    texts = dict(zip(a["ctx_positions"], a["ctx_texts"]))
    where = f" (denoising step {step.step + 1} of {step.n_steps})" if step.n_steps > 1 else ""
    head = (f'<p class="attn-head"><strong>What the draft attends to</strong>{attr(where)}: block {attr(info.block)}, '
            f'anchor at position {attr(a["anchor"])}, {attr(a["context_len"])} context positions, top '
            f'{attr(a["top_k"])} per slot, averaged over {attr(a["heads"])} heads.</p><p class="attn-why">{attr(WHY)}</p>')
    layers = "".join(_layer_html(i, layer, step, texts) for i, layer in enumerate(a["layers"]))
    return f'<section class="dfl-attn" aria-label="What the draft attends to">{head}{layers}</section>'


def _shade(w: float, top: float) -> str:
    """Background for weight `w`, relative to the row's largest weight `top`."""
    alpha = 0.08 + 0.72 * (w / top if top > 0 else 0.0)
    return f' style="background-color: rgba({RGB},{alpha:.2f})"'


def _layer_html(i: int, layer: dict, step: ev.DraftStep, texts: dict[int, str]) -> str:
    """One draft layer: a row per block slot (context tokens | weights over the block), then the heads' shares."""
    b = len(layer["block"])
    cols = '<th scope="col" class="attn-anchor">anchor</th>' + "".join(f'<th scope="col">{j}</th>' for j in range(1, b))
    rows = []
    for slot in range(b):
        top = max([*layer["ctx_w"][slot], *layer["block"][slot], 0.0])
        label = "anchor" if slot == 0 else f"{slot}"
        tip = f"block slot {label}: {quoted(step.token_texts[slot])}; {layer['ctx_share'][slot]:.0%} of its attention on the context"
        ctx = "".join(_ctx_token(p, w, top, texts.get(p, "?"))
                      for p, w in sorted(zip(layer["ctx_pos"][slot], layer["ctx_w"][slot])))
        blk = "".join(f'<td class="attn-w{" attn-anchor" if j == 0 else ""}"{_shade(w, top)} '
                      f'title="{attr(f"slot {label} → slot {j}: weight {w:.3f}")}">{round(100 * w)}</td>'
                      for j, w in enumerate(layer["block"][slot]))
        rows.append(f'<tr><th scope="row" class="{"attn-anchor" if slot == 0 else ""}" title="{attr(tip)}">{attr(label)} '
                    f'<span class="ct">{show_text(step.token_texts[slot], False)}</span></th>'
                    f'<td class="attn-ctx"><small>{layer["ctx_share"][slot]:.0%}</small> {ctx}</td>{blk}</tr>')
    heads = _heads_html(layer["head_ctx_share"])
    return (f'<details class="attn-layer"{" open" if i == 0 else ""}><summary>Draft layer {i}</summary>'
            f'<div class="insp-scroll"><table class="attn" aria-label="Draft layer {i}: attention per block slot">'
            f'<thead><tr><th scope="col">slot</th><th scope="col">context: share, then the top tokens in order '
            f'(shading = weight)</th>{cols}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>{heads}</details>')


def _ctx_token(pos: int, w: float, top: float, text: str) -> str:
    tip = f"position {pos}: {quoted(text)}, weight {w:.3f}"
    return f'<span class="attn-tok"{_shade(w, top)} title="{attr(tip)}">{show_text(text, False)}</span>'


def _heads_html(shares: list[list[float]]) -> str:
    """Per head, the share of the drafted slots' attention that goes to the injected context (slot 0 left out)."""
    cells = []
    for h, row in enumerate(shares):
        drafted = row[1:] or row
        mean = sum(drafted) / len(drafted)
        cells.append(f'<span class="attn-headcell"{_shade(mean, 1.0)} title="{attr(f"head {h}: {mean:.0%} on the context")}">'
                     f'{round(100 * mean)}</span>')
    return f'<p class="attn-heads">Per head, % of the drafted slots\' attention on the context: {"".join(cells)}</p>'
