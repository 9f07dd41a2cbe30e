"""Pure render functions: engine events → HTML for the token stream, the block inspector and the statistics.

Nothing here touches a model or Gradio: every function takes a list of `dflash.events` objects (a live run or
a loaded trace, possibly cut at a replay frame) and returns a string, so a trace replays exactly as it ran.
Colours are Okabe-Ito (colour-blind safe) and every state also has a non-colour cue (underline style, strike-
through, hatching, glyph); the CSS lives in assets/playground.css.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from dflash import events as ev

# Okabe-Ito colours, also used by ui/plots.py.
BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, GREY = "#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#6B6B6B"

# Token classes → (legend label, non-colour cue described in words).
TOKEN_STYLES = {
    "draft": ("accepted draft token", "solid underline"),
    "correction": ("target's correction at the first rejection", "bold, double underline"),
    "bonus": ("target's bonus token after a fully accepted block", "bold, dashed underline"),
    "first": ("first token (from the prompt's prefill)", "dotted underline"),
    "target": ("target token (no draft: plain autoregressive decoding)", "dotted underline"),
    "rejected": ("rejected draft token (discarded)", "struck through, small"),
    "relaxed": ("accepted only by the lossy threshold", "accepted style + dashed outline"),
}


@dataclass
class BlockInfo:
    """Everything the events say about one block (block 0 = the prefill's first token)."""

    block: int
    size: ev.BlockSize | None = None
    steps: list[ev.DraftStep] = field(default_factory=list)
    verify: ev.Verify | None = None
    commit: ev.Commit | None = None


def group_blocks(events: list) -> dict[int, BlockInfo]:
    blocks: dict[int, BlockInfo] = {}
    for e in events:
        if isinstance(e, (ev.BlockSize, ev.DraftStep, ev.Verify, ev.Commit)):
            info = blocks.setdefault(e.block, BlockInfo(e.block))
            if isinstance(e, ev.BlockSize):
                info.size = e
            elif isinstance(e, ev.DraftStep):
                info.steps.append(e)
            elif isinstance(e, ev.Verify):
                info.verify = e
            else:
                info.commit = e
    return blocks


def started(events: list) -> ev.Started | None:
    return next((e for e in events if isinstance(e, ev.Started)), None)


def finished(events: list) -> ev.Finished | None:
    return events[-1] if events and isinstance(events[-1], ev.Finished) else None


# -- text helpers ----------------------------------------------------------------------------------------------
def show_text(text: str, breaks: bool = True) -> str:
    """Token text made visible and safe: HTML-escaped, newline as ↵ (+ a line break when `breaks`: committed
    text, not rejected tokens or grid cells), other control characters as Unicode control pictures, an empty
    token as ∅."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch == "\n":
            out.append("↵\n" if breaks else "↵")
        elif ch == "\t":
            out.append("⇥\t" if breaks else "⇥")
        elif ord(ch) < 32:
            out.append(chr(0x2400 + ord(ch)))
        elif ord(ch) == 127:
            out.append("␡")
        else:
            out.append(ch)
    return html.escape("".join(out), quote=True)


def quoted(text: str) -> str:
    """A token for a tooltip or a sentence: repr-like quotes, whitespace visible."""
    return "“" + text.replace("\n", "↵").replace("\t", "⇥") + "”"


def attr(text: str) -> str:
    return html.escape(text, quote=True)


# -- token stream ----------------------------------------------------------------------------------------------
def token_class(kind: str, block: int, has_draft: bool) -> str:
    if block == 0:
        return "first"
    if not has_draft:
        return "target"
    return kind


def _token_span(cls: str, text: str, title: str, extra: str = "") -> str:
    return f'<span class="tok tok-{cls}{extra}" title="{attr(title)}">{show_text(text, breaks=cls != "rejected")}</span>'


def token_spans(events: list, show_rejected: bool = True) -> list[str]:
    """One <span> per committed token, in output order; rejected draft tokens (optional) before each correction."""
    st = started(events)
    has_draft = bool(st.has_draft) if st else True
    verifies: dict[int, ev.Verify] = {}
    spans: list[str] = []
    for e in events:
        if isinstance(e, ev.Verify):
            verifies[e.block] = e
        if not isinstance(e, ev.Commit):
            continue
        v = verifies.get(e.block)
        first_index = e.n_out - len(e.token_ids)  # output index of this commit's first token
        for i, (tid, kind, text) in enumerate(zip(e.token_ids, e.kinds, e.texts)):
            pos = first_index + i
            cls = token_class(kind, e.block, has_draft)
            conf = e.confidences[i] if i < len(e.confidences) else -1.0
            if cls == "correction" and v is not None and show_rejected:
                spans.extend(_rejected_spans(v))
            title = _token_title(cls, e.block, pos, conf, v, i, text)
            relaxed = cls == "draft" and v is not None and i < len(v.relaxed) and v.relaxed[i]
            spans.append(_token_span(cls, text, title, " tok-relaxed" if relaxed else ""))
    return spans


def _rejected_spans(v: ev.Verify) -> list[str]:
    out = []
    a = v.accepted_len
    for j in range(a, len(v.draft_tokens)):
        first = j == a
        why = (f"target wanted {quoted(v.target_texts[j])}" if first and j < len(v.target_texts)
               else "discarded: it follows the first rejection")
        title = f"block {v.block} · draft position {j + 1} · rejected draft token {quoted(v.draft_texts[j])} · {why}"
        out.append(_token_span("rejected", v.draft_texts[j], title))
    return out


def _token_title(cls: str, block: int, pos: int, conf: float, v: ev.Verify | None, i: int, text: str) -> str:
    head = f"block {block} · output token {pos}"
    if cls == "first":
        return f"{head} · the target's first token, from the prompt's prefill"
    if cls == "target":
        return f"{head} · the target's own token (no draft)"
    if v is None:
        return f"{head} · {TOKEN_STYLES.get(cls, (cls,))[0]}"
    target_choice = quoted(v.target_texts[i]) if i < len(v.target_texts) else "?"
    if cls == "draft":
        relaxed = i < len(v.relaxed) and v.relaxed[i]
        verdict = f"target's choice {target_choice}" + (" (accepted by the LOSSY threshold)" if relaxed else " ✓")
        return f"{head} · draft position {i + 1} · accepted draft token · draft confidence {conf:.2f} · {verdict}"
    if cls == "correction":
        proposed = quoted(v.draft_texts[i]) if i < len(v.draft_texts) else "?"
        return f"{head} · draft position {i + 1} · target's correction: the draft proposed {proposed}, the target chose {quoted(text)}"
    return f"{head} · bonus token: all {len(v.draft_tokens)} drafted tokens accepted, the target adds {quoted(text)}"


def legend_html(has_draft: bool = True, show_rejected: bool = True) -> str:
    keys = ["draft", "correction", "bonus", "first"] if has_draft else ["target", "first"]
    if has_draft and show_rejected:
        keys.insert(2, "rejected")
    items = "".join(f'<li><span class="tok tok-{k}">abc</span> {attr(TOKEN_STYLES[k][0])} '
                    f'<span class="cue">({attr(TOKEN_STYLES[k][1])})</span></li>' for k in keys)
    return f'<ul class="dfl-legend" aria-label="Legend">{items}</ul>'


def prompt_of(st: ev.Started | None) -> str:
    if st is None:
        return ""
    return st.request.get("prompt") or st.prompt_text


def token_stream_html(events: list, show_rejected: bool = True,
                      placeholder: str = "Press Generate (or load a trace) to see tokens stream here.") -> str:
    """The answer as token spans and nothing else: while a run grows, each new value extends the previous one,
    so Gradio streams only the appended part (the page wraps it with TOKEN_TEMPLATE)."""
    spans = token_spans(events, show_rejected)
    return "".join(spans) if spans else f'<span class="dfl-placeholder">{attr(placeholder)}</span>'


# The token stream component's frame: column-reverse keeps the newest tokens in view as the answer grows.
TOKEN_TEMPLATE = ('<div class="dfl-stream-scroll"><div class="dfl-stream">${value}</div></div>'
                  '<div class="tok-details" aria-live="polite">Hover over (or click) a token: block, position, draft '
                  "confidence and the target's choice.</div>")


def token_header_html(events: list, show_rejected: bool = True) -> str:
    """Legend (colour + non-colour cue for each kind present in this kind of run) and the prompt."""
    st = started(events)
    has_draft = bool(st.has_draft) if st else True
    prompt = prompt_of(st)
    head = (f'<div class="dfl-prompt"><b>Prompt:</b> {attr(prompt[:400])}{"…" if len(prompt) > 400 else ""}</div>'
            if prompt else "")
    return f'<div class="dfl-tokens-head">{legend_html(has_draft, show_rejected)}{head}</div>'


FINISH_WORDS = {"eos": "the model ended its answer", "length": "reached max new tokens", "stop": "hit a stop token",
                "cancelled": "stopped by the user", "timeout": "stopped at the per-request deadline",
                "error": "stopped by an error"}


def finish_words(fin: ev.Finished | None) -> str:
    if fin is None:
        return ""
    words = FINISH_WORDS.get(fin.reason, fin.reason)
    extra = f" — {fin.message}" if fin.message and fin.reason not in ("cancelled",) else ""
    return f"Finished ({fin.reason}): {words}{extra}."


# -- block inspector -------------------------------------------------------------------------------------------
def block_summary(info: BlockInfo) -> str:
    """One plain sentence per block (also read out by screen readers)."""
    v = info.verify
    if info.block == 0:
        return "Block 0: the prompt's prefill; the target picks the first token itself."
    if v is None:
        n = len(info.steps)
        return f"Block {info.block}: drafting (denoising step {n} of {info.steps[-1].n_steps})…" if n else f"Block {info.block}: starting…"
    drafted = len(v.draft_tokens)
    if drafted == 0:
        return f"Block {info.block}: no draft — the target decodes one token ({quoted(v.target_texts[0]) if v.target_texts else ''})."
    a = v.accepted_len
    if a == drafted:
        return f"Block {info.block}: all {drafted} drafted tokens accepted, +1 bonus token {quoted(v.target_texts[-1])} → {a + 1} tokens."
    return (f"Block {info.block}: {a} of {drafted} drafted tokens accepted; rejected at position {a + 1} "
            f"(draft {quoted(v.draft_texts[a])}, target {quoted(v.target_texts[a])}) → {a + 1} tokens.")


def _conf_style(conf: float) -> str:
    c = min(max(conf, 0.0), 1.0)
    return f' style="background-color: rgba(0,114,178,{0.06 + 0.5 * c:.2f})"'


def _cell(text: str, conf: float | None, cls: str, title: str) -> str:
    conf_txt = f'<small class="conf">{conf:.2f}</small>' if conf is not None else ""
    style = _conf_style(conf) if conf is not None and cls not in ("cell-mask",) else ""
    return f'<td class="{cls}" title="{attr(title)}"{style}><span class="ct">{show_text(text, False)}</span>{conf_txt}</td>'


def inspector_grid(info: BlockInfo) -> list[list[dict]]:
    """The grid as data (rows of cells), for tests and for the HTML: one row per denoising step, then the
    verification row. Cell keys: kind ∈ {anchor, mask, new, old, ok, bad, skip, next}, text, conf."""
    rows: list[list[dict]] = []
    for s in info.steps:
        row = []
        for i, (tid, text, conf, masked, committed) in enumerate(zip(s.tokens, s.token_texts, s.confidences, s.masked, s.committed)):
            kind = "anchor" if i == 0 else "mask" if masked else "new" if committed else "old"
            row.append({"kind": kind, "text": text, "conf": conf, "pos": i})
        rows.append(row)
    v = info.verify
    if v is not None:
        row = [{"kind": "anchor", "text": "", "conf": None, "pos": 0}]
        for i, tok in enumerate(v.draft_texts):
            if i < v.accepted_len:
                row.append({"kind": "ok", "text": tok, "conf": None, "pos": i + 1})
            elif i == v.accepted_len:
                row.append({"kind": "bad", "text": v.target_texts[i], "conf": None, "pos": i + 1, "draft": tok})
            else:
                row.append({"kind": "skip", "text": tok, "conf": None, "pos": i + 1})
        rows.append(row)
    return rows


def inspector_html(events: list, block: int | None = None) -> str:
    """Grid of denoising steps × block positions for `block` (None or missing: the latest block)."""
    blocks = group_blocks(events)
    if not blocks:
        return '<div class="dfl-insp"><p class="dfl-placeholder">The block inspector shows each draft block here: denoising steps × positions, then the target\'s verdict.</p></div>'
    info = blocks.get(block) if block else None
    if info is None:
        info = blocks[max(blocks)]
    summary = f'<p class="insp-summary" aria-live="polite">{attr(block_summary(info))}</p>'
    size = info.size
    ctrl = f'<p class="insp-ctrl">Controller: block size {size.size} — {attr(size.reason)}</p>' if size else ""
    if info.block == 0 or (info.verify is None and not info.steps):
        return f'<div class="dfl-insp">{summary}{ctrl}</div>'
    grid = inspector_grid(info)
    width = max(len(r) for r in grid)
    start = info.steps[0].start if info.steps else (info.verify.start if info.verify else 0)
    head = "".join(f'<th scope="col" title="absolute position {start + i}">{"anchor" if i == 0 else i}</th>' for i in range(width))
    rows_html = []
    for r, row in enumerate(grid):
        is_verify = info.verify is not None and r == len(grid) - 1
        if is_verify:
            label = "verify"
        else:
            s = info.steps[r]
            label = f"step {s.step + 1}/{s.n_steps}"
        cells = []
        for c in row:
            k = c["kind"]
            if k == "anchor":
                cells.append(_cell("·" if is_verify else c["text"], None, "cell-anchor", "anchor: the last committed token (not drafted)"))
            elif k == "mask":
                tip = f"still MASK after this step; current best guess {quoted(c['text'])} ({c['conf']:.2f})"
                cells.append(f'<td class="cell-mask" title="{attr(tip)}"><span class="ct">MASK</span>'
                             f'<small class="conf">{c["conf"]:.2f}</small></td>')
            elif k == "new":
                cells.append(_cell(c["text"], c["conf"], "cell-new", f"committed at this step (confidence {c['conf']:.2f})"))
            elif k == "old":
                cells.append(_cell(c["text"], c["conf"], "cell-old", f"committed at an earlier step (confidence {c['conf']:.2f})"))
            elif k == "ok":
                cells.append(f'<td class="v-ok" title="accepted: the target agrees"><span class="glyph">✓</span></td>')
            elif k == "bad":
                tip = f"rejected: draft {quoted(c['draft'])}, the target chose {quoted(c['text'])}"
                cells.append(f'<td class="v-bad" title="{attr(tip)}"><span class="glyph">✗</span> '
                             f'<span class="ct">{show_text(c["text"], False)}</span></td>')
            else:
                cells.append('<td class="v-skip" title="not counted: after the first rejection">–</td>')
        rows_html.append(f'<tr class="{"row-verify" if is_verify else "row-step"}"><th scope="row">{label}</th>{"".join(cells)}</tr>')
    nxt = ""
    if info.verify is not None and info.verify.draft_tokens:
        v = info.verify
        word = "bonus" if v.accepted_len == len(v.draft_tokens) else "correction"
        nxt = (f'<p class="insp-next">Target adds: <span class="tok tok-{word}">{show_text(v.target_texts[v.accepted_len], False)}</span> '
               f'({word}) · draft {v.draft_ms:.0f} ms · verify {v.verify_ms:.0f} ms</p>')
    elif info.verify is not None:
        nxt = f'<p class="insp-next">verify {info.verify.verify_ms:.0f} ms (one target forward)</p>'
    table = (f'<div class="insp-scroll"><table class="insp" aria-label="Block {info.block}: denoising steps by position">'
             f'<thead><tr><th scope="col">block {info.block}</th>{head}</tr></thead><tbody>{"".join(rows_html)}</tbody></table></div>')
    key = ('<p class="insp-key">Cells: shading = draft confidence · <span class="key-new">outlined ●</span> committed at this step · '
           '<span class="key-mask">hatched MASK</span> still masked · ✓ accepted · ✗ first rejection (with the target\'s token) · – not counted</p>')
    return f'<div class="dfl-insp">{summary}{ctrl}{table}{nxt}{key}</div>'


# -- statistics --------------------------------------------------------------------------------------------------
def comparison(run_events: list, base_events: list) -> dict:
    """Baseline vs run: tok/s, speedup, and whether the outputs are identical (first differing position)."""
    from dflash.stats import compute_stats

    run_ids = _output_ids(run_events)
    base_ids = _output_ids(base_events)
    rs, bs = _stats(run_events, compute_stats), _stats(base_events, compute_stats)
    n = min(len(run_ids), len(base_ids))
    first_diff = next((i for i in range(n) if run_ids[i] != base_ids[i]), None)
    if first_diff is None and len(run_ids) != len(base_ids):
        first_diff = n
    speed = rs["tokens_per_s"] / bs["tokens_per_s"] if bs["tokens_per_s"] > 0 else 0.0
    return {"baseline_tokens_per_s": bs["tokens_per_s"], "run_tokens_per_s": rs["tokens_per_s"], "speedup": speed,
            "identical": first_diff is None, "first_diff": first_diff, "n_compared": n,
            "baseline_ttft_ms": bs["ttft_ms"], "lossy": rs["lossy"]}


def _output_ids(events: list) -> list[int]:
    fin = finished(events)
    if fin is not None:
        return list(fin.output_ids)
    return [t for e in events if isinstance(e, ev.Commit) for t in e.token_ids]


def _stats(events: list, compute) -> dict:
    fin = finished(events)
    return fin.stats if fin is not None and fin.stats else compute(events)


def run_stats(events: list) -> dict:
    from dflash.stats import compute_stats

    return _stats(events, compute_stats)


def stats_html(events: list, compare: dict | None = None, hardware: str = "") -> str:
    if not events:
        return '<div class="dfl-stats"><p class="dfl-placeholder">Statistics appear here while a run streams.</p></div>'
    s = run_stats(events)
    st = started(events)
    draft_share = s["draft_share"] * 100
    items = [
        ("τ (tokens per target step)", f"{s['tau']:.2f}", "Mean tokens committed per verify step, bonus/correction token included. 1.00 = no gain."),
        ("tokens / s", f"{s['tokens_per_s']:.1f}", "Decode speed after the first token."),
        ("time to first token", f"{s['ttft_ms']:.0f} ms", "Prompt prefill + the first token."),
        ("draft / verify time", f"{draft_share:.0f}% / {100 - draft_share:.0f}%" if s["verify_ms"] else "–",
         f"draft {s['draft_ms']:.0f} ms, verify {s['verify_ms']:.0f} ms in total"),
        ("output tokens", f"{s['n_output_tokens']}", f"{s['n_verify']} target verify steps, prompt {s['n_prompt_tokens']} tokens"),
    ]
    cells = "".join(f'<div class="stat" title="{attr(h)}"><div class="k">{attr(k)}</div><div class="v">{attr(v)}</div></div>'
                    for k, v, h in items)
    badges = []
    if st is not None and not st.has_draft:
        badges.append('<span class="badge badge-info">no draft: autoregressive baseline</span>')
    if s.get("lossy"):
        badges.append(f'<span class="badge badge-lossy">⚠ LOSSY (acceptance threshold &lt; 1): {s["drift_tokens"]} tokens accepted '
                      f'that the target would not have chosen</span>')
    fin = finished(events)
    if fin is not None:
        badges.append(f'<span class="badge">{attr(fin.reason)}</span>')
    comp = ""
    if compare:
        ok = compare["identical"]
        same = ("✓ identical to the target's own output" if ok else
                f"✗ differs from the target's own output at token {compare['first_diff']}")
        comp = (f'<div class="stat-compare" id="compare-result">'
                f'<div class="stat"><div class="k">baseline tokens / s</div><div class="v">{compare["baseline_tokens_per_s"]:.1f}</div></div>'
                f'<div class="stat"><div class="k">speedup</div><div class="v">{compare["speedup"]:.2f}×</div></div>'
                f'<div class="stat"><div class="k">outputs</div><div class="v {"same" if ok else "diff"}">{attr(same)}</div></div>'
                f'<p class="cmp-note">Baseline = the same engine without a draft (one token per target step), same prompt and '
                f'settings, {compare["n_compared"]} tokens compared.</p></div>')
    hw = f'<p class="hw">{attr(hardware)}</p>' if hardware else ""
    data = (f'<span hidden class="stats-data" data-tau="{s["tau"]:.4f}" data-n-out="{s["n_output_tokens"]}" '
            f'data-n-verify="{s["n_verify"]}" data-reason="{attr(fin.reason if fin else "running")}"></span>')
    return f'<div class="dfl-stats"><div class="stat-grid">{cells}</div><div class="badges">{"".join(badges)}</div>{comp}{hw}{data}</div>'
