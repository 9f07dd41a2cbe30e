"""Pure render function for the block inspector: one block's denoising steps × positions, then the verdict.

Cells show the draft's token and confidence (shading) or MASK (hatched), the positions committed at each step
(outlined, ●), and the verification row (✓ accepted, ✗ the first rejection with the target's token, – after).
"""

from __future__ import annotations

from dflash.decode import events as ev
from .render import BlockInfo, attr, count, plural, quoted, show_text
from .render_attention import attention_html
from .run_state import RunState, as_state


def block_summary(info: BlockInfo) -> str:
    """One plain sentence per block (also read out by screen readers)."""
    v = info.verify
    if info.block == 0:
        return "Block 0: the prompt's prefill; the target picks the first token itself."
    if v is None:
        n = len(info.steps)
        if not n:
            return f"Block {info.block}: starting…"
        return f"Block {info.block}: drafting (denoising step {n} of {info.steps[-1].n_steps})…"
    drafted = len(v.draft_tokens)
    if drafted == 0:
        token = quoted(v.target_texts[0]) if v.target_texts else ""
        return f"Block {info.block}: no draft — the target decodes one token ({token})."
    a = v.accepted_len
    copied = v.source == ev.COPY
    tokens = plural(drafted, "token")
    what, who = (f"{tokens} copied from the context (no draft pass)", "copy") if copied else (f"drafted {tokens}", "draft")
    if a == drafted:
        verdict = f"all {drafted} {what} accepted, +1 bonus token {quoted(v.target_texts[-1])}"
    else:
        verdict = (f"{a} of {drafted} {what} accepted; rejected at position {a + 1} "
                   f"({who} {quoted(v.draft_texts[a])}, target {quoted(v.target_texts[a])})")
    # The run can end inside the block (EOS, a stop id, max new tokens): the tokens verified past its end are not
    # output (τ still counts them, as the acceptance length of the step; dflash/decode/stats.py).
    kept = len(info.commit.token_ids) if info.commit is not None else a + 1
    ending = "" if kept >= a + 1 else f" verified; the answer ended after {kept} of them"
    return f"Block {info.block}: {verdict} → {count(a + 1, 'token')}{ending}."


def _conf_style(conf: float) -> str:
    c = min(max(conf, 0.0), 1.0)
    return f' style="background-color: rgba(0,114,178,{0.06 + 0.5 * c:.2f})"'


def _cell(text: str, conf: float | None, cls: str, title: str) -> str:
    conf_txt = f'<small class="conf">{conf:.2f}</small>' if conf is not None else ""
    style = _conf_style(conf) if conf is not None and cls not in ("cell-mask",) else ""
    return f'<td class="{cls}" title="{attr(title)}"{style}><span class="ct">{show_text(text, False)}</span>{conf_txt}</td>'


def inspector_grid(info: BlockInfo) -> list[list[dict]]:
    """The grid as data (rows of cells), for tests and for the HTML: one row per denoising step, then the
    verification row. Cell keys: kind ∈ {anchor, mask, new, old, copy, ok, bad, skip, next}, text, conf."""
    rows: list[list[dict]] = []
    copied = info.size is not None and info.size.source == ev.COPY  # one row of copied tokens, no confidences
    for s in info.steps:
        row = []
        for i, (text, conf, masked, committed) in enumerate(zip(s.token_texts, s.confidences, s.masked, s.committed)):
            kind = "anchor" if i == 0 else "copy" if copied else "mask" if masked else "new" if committed else "old"
            row.append({"kind": kind, "text": text, "conf": conf, "pos": i})
        rows.append(row)
    v = info.verify
    if v is not None:
        row = [{"kind": "anchor", "text": "", "conf": None, "pos": 0}]
        for i, tok in enumerate(v.draft_texts):
            if i < v.accepted_len:
                row.append({"kind": "ok", "text": tok, "conf": None, "pos": i + 1})
            elif i == v.accepted_len:
                row.append({"kind": "bad", "text": v.target_texts[i], "conf": None, "pos": i + 1, "draft": tok,
                            "who": "copy" if v.source == ev.COPY else "draft"})
            else:
                row.append({"kind": "skip", "text": tok, "conf": None, "pos": i + 1})
        rows.append(row)
    return rows


PLACEHOLDER = ('<div class="dfl-insp"><p class="dfl-placeholder">The block inspector shows each draft block here: '
               'denoising steps × positions, then the target\'s verdict.</p></div>')
KEY = ('<p class="insp-key">Cells: shading = draft confidence · <span class="key-new">outlined ●</span> committed at '
       'this step · <span class="key-mask">hatched MASK</span> still masked · ✓ accepted · ✗ first rejection (with '
       'the target\'s token) · – not counted</p>')
HINT_KEY = (' · copy hints: the token a copy from the context offers each position (a hinted draft reads them '
            'as inputs and may overrule them)</p>')
COPY_KEY = ('<p class="insp-key">Cells: <span class="cell-copy">wavy underline</span> = copied from the context (the '
            'tokens that followed the same n-gram earlier; no draft pass, no confidences) · ✓ accepted · ✗ first '
            'rejection (with the target\'s token) · – not counted</p>')


def inspector_html(run: RunState | list, block: int | None = None) -> str:
    """Grid of denoising steps × block positions for `block` (None or missing: the latest block)."""
    state = as_state(run)
    blocks = state.blocks
    if not blocks:
        return PLACEHOLDER
    info = blocks.get(block) if block else None
    # A block asked for that this point of the run has not reached (scrubbing back in a replay): say so, show the latest.
    ahead = (f'<p class="insp-note">Block {attr(block)} is not reached at this point of the run; showing the latest.</p>'
             if block and info is None else "")
    if info is None:
        info = blocks[state.latest_block]
    summary = f'{ahead}<p class="insp-summary" aria-live="polite">{attr(block_summary(info))}</p>'
    size = info.size
    ctrl = f'<p class="insp-ctrl">Controller: block size {attr(size.size)} — {attr(size.reason)}</p>' if size else ""
    if info.block == 0 or (info.verify is None and not info.steps):
        return f'<div class="dfl-insp">{summary}{ctrl}</div>'
    key = COPY_KEY if info.size is not None and info.size.source == ev.COPY else KEY
    if key is KEY and info.steps and info.steps[0].hints is not None:
        key = key.replace("</p>", HINT_KEY)
    return f'<div class="dfl-insp">{summary}{ctrl}{_grid_table(info)}{_verdict_line(info)}{key}{attention_html(info)}</div>'


def _grid_table(info: BlockInfo) -> str:
    """The grid as an HTML table: a header of positions, one row per denoising step, then the verify row."""
    grid = inspector_grid(info)
    width = max(len(r) for r in grid)
    start = info.steps[0].start if info.steps else (info.verify.start if info.verify else 0)
    head = "".join(f'<th scope="col" title="absolute position {attr(start + i)}">{"anchor" if i == 0 else i}</th>'
                   for i in range(width))
    rows_html = []
    for r, row in enumerate(grid):
        is_verify = info.verify is not None and r == len(grid) - 1
        if is_verify:
            label = "verify"
        elif info.size is not None and info.size.source == ev.COPY:
            label = "copied"  # one row: the span that followed the anchor's n-gram earlier, no denoising
        else:
            s = info.steps[r]
            label = attr(f"step {s.step + 1}/{s.n_steps}")
        cells = "".join(_cell_html(c, is_verify) for c in row)
        row_cls = "row-verify" if is_verify else "row-step"
        rows_html.append(f'<tr class="{row_cls}"><th scope="row">{label}</th>{cells}</tr>')
    return (f'<div class="insp-scroll"><table class="insp" aria-label="Block {attr(info.block)}: denoising steps by '
            f'position"><thead><tr><th scope="col">block {attr(info.block)}</th>{head}</tr></thead>'
            f'<tbody>{_hint_row(info)}{"".join(rows_html)}</tbody></table></div>')


def _hint_row(info: BlockInfo) -> str:
    """A hinted draft's copy hints, above its denoising steps: per slot the token a copy from the context offered
    (the draft reads it as an input and may overrule it), or – where no n-gram recurred; "" for z-lab's draft."""
    s = info.steps[0] if info.steps else None
    if s is None or s.hints is None or info.size is not None and info.size.source == ev.COPY:
        return ""
    cells = ['<td class="cell-anchor" title="the anchor gets no hint">·</td>']
    for text, n in zip(s.hint_texts[1:], s.hint_n[1:]):
        if n:
            tip = f"hint: {quoted(text)} followed the same {n}-gram earlier in the context"
            cells.append(f'<td class="cell-hint" title="{attr(tip)}"><span class="ct">{show_text(text, False)}</span>'
                         f'<small class="conf">{n}-gram</small></td>')
        else:
            cells.append('<td class="cell-hint cell-nohint" title="no hint: the anchor\'s last tokens did not occur '
                         'earlier">–</td>')
    return f'<tr class="row-hint"><th scope="row">copy hints</th>{"".join(cells)}</tr>'


def _cell_html(c: dict, is_verify: bool) -> str:
    """One cell of `inspector_grid` as a table cell (every text escaped)."""
    k = c["kind"]
    if k == "anchor":
        return _cell("·" if is_verify else c["text"], None, "cell-anchor", "anchor: the last committed token (not drafted)")
    if k == "mask":
        tip = f"still MASK after this step; current best guess {quoted(c['text'])} ({c['conf']:.2f})"
        return (f'<td class="cell-mask" title="{attr(tip)}"><span class="ct">MASK</span>'
                f'<small class="conf">{c["conf"]:.2f}</small></td>')
    if k == "new":
        return _cell(c["text"], c["conf"], "cell-new", f"committed at this step (confidence {c['conf']:.2f})")
    if k == "copy":
        return _cell(c["text"], None, "cell-copy", "copied: it followed the same tokens earlier in the context")
    if k == "old":
        return _cell(c["text"], c["conf"], "cell-old", f"committed at an earlier step (confidence {c['conf']:.2f})")
    if k == "ok":
        return '<td class="v-ok" title="accepted: the target agrees"><span class="glyph">✓</span></td>'
    if k == "bad":
        tip = f"rejected: {c.get('who', 'draft')} {quoted(c['draft'])}, the target chose {quoted(c['text'])}"
        return (f'<td class="v-bad" title="{attr(tip)}"><span class="glyph">✗</span> '
                f'<span class="ct">{show_text(c["text"], False)}</span></td>')
    return '<td class="v-skip" title="not counted: after the first rejection">–</td>'


def _verdict_line(info: BlockInfo) -> str:
    """What the target adds after verification (bonus or correction) and the timings; "" before verification."""
    v = info.verify
    if v is None:
        return ""
    if not v.draft_tokens:
        return f'<p class="insp-next">verify {v.verify_ms:.0f} ms (one target forward)</p>'
    word = "bonus" if v.accepted_len == len(v.draft_tokens) else "correction"
    added = show_text(v.target_texts[v.accepted_len], False)
    proposal = "copied (no draft pass)" if v.source == ev.COPY else f"draft {v.draft_ms:.0f} ms"
    return (f'<p class="insp-next">Target adds: <span class="tok tok-{word}">{added}</span> '
            f'({word}) · {proposal} · verify {v.verify_ms:.0f} ms</p>')
