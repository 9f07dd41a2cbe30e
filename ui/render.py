"""Pure render functions: engine events → HTML for the token stream (the block inspector and the statistics
panel are in render_inspector.py and render_stats.py), plus the event helpers they share.

Nothing here touches a model or Gradio: every function takes a list of `dflash.decode.events` objects (a live run or
a loaded trace, possibly cut at a replay frame) or the RunState they fold into (ui/run_state.py), and returns a
string, so a trace replays exactly as it ran. Every value from the events is escaped on its way into HTML.
Colours are Okabe-Ito (colour-blind safe) and every state also has a non-colour cue (underline style, strike-
through, hatching, glyph); the CSS lives in assets/playground.css.
"""

from __future__ import annotations

import html
import re
from typing import Any

from dflash.decode import events as ev
from dflash.decode.stats import compute_stats
from .run_state import BlockInfo, RunState, as_state

# Okabe-Ito colours, also used by ui/plots.py.
BLUE, VERMILLION, GREEN, ORANGE, GREY = "#0072B2", "#D55E00", "#009E73", "#E69F00", "#6B6B6B"

# Token classes → (legend label, non-colour cue described in words).
TOKEN_STYLES = {
    "draft": ("accepted draft token", "solid underline"),
    "copy": ("accepted token copied from the context", "wavy underline"),
    "correction": ("target's correction at the first rejection", "bold, double underline"),
    "bonus": ("target's bonus token after a fully accepted block", "bold, dashed underline"),
    "first": ("first token (from the prompt's prefill)", "dotted underline"),
    "target": ("target token (no draft: plain autoregressive decoding)", "dotted underline"),
    "rejected": ("rejected draft token (discarded)", "struck through, small"),
    "relaxed": ("accepted only by the lossy threshold", "accepted style + dashed outline"),
}


def group_blocks(run: RunState | list) -> dict[int, BlockInfo]:
    return as_state(run).blocks


def started(run: RunState | list) -> ev.Started | None:
    if isinstance(run, RunState):
        return run.started
    return next((e for e in run if isinstance(e, ev.Started)), None)


def finished(run: RunState | list) -> ev.Finished | None:
    if isinstance(run, RunState):
        return run.finished
    return run[-1] if run and isinstance(run[-1], ev.Finished) else None


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


def plural(n: int, noun: str) -> str:
    """The noun in the number `n` asks for (regular plurals only): "token", "tokens"."""
    return noun if n == 1 else f"{noun}s"


def count(n: int, noun: str) -> str:
    """"1 token", "3 tokens"."""
    return f"{n} {plural(n, noun)}"


def quoted(text: str) -> str:
    """A token for a tooltip or a sentence: repr-like quotes, whitespace visible."""
    return "“" + text.replace("\n", "↵").replace("\t", "⇥") + "”"


def attr(value: Any) -> str:
    """Any value as the text of an HTML attribute or element."""
    return html.escape(str(value), quote=True)


def md_text(text: str) -> str:
    """Text for a Markdown component, shown as typed: HTML escaped, Markdown's link, emphasis and code signs
    backslashed (so a trace's title cannot become a link, an image or markup)."""
    return re.sub(r"([\\`*_\[\]()#!|~])", r"\\\1", html.escape(text, quote=False))


# -- token stream ----------------------------------------------------------------------------------------------
def token_class(kind: str, block: int, has_draft: bool) -> str:
    """The CSS class suffix: a fixed name, never text from the events."""
    if block == 0:
        return "first"
    if not has_draft:
        return "target"
    return kind if kind in ev.TOKEN_KINDS else "other"


def _token_span(cls: str, text: str, title: str, extra: str = "") -> str:
    return f'<span class="tok tok-{cls}{extra}" title="{attr(title)}">{show_text(text, breaks=cls != "rejected")}</span>'


def token_spans(run: RunState | list, show_rejected: bool = True) -> list[str]:
    """One <span> per committed token, in output order; rejected draft tokens (optional) before each correction."""
    return list(_spans(as_state(run), show_rejected))


def _spans(state: RunState, show_rejected: bool) -> list[str]:
    """The spans so far, kept in the state: only commits added (or taken back) since the last call cost work."""
    done = state.cache.setdefault(("spans", show_rejected), {"commits": [], "ends": [], "spans": []})
    commits, ends, spans = done["commits"], done["ends"], done["spans"]  # rendered commits, len(spans) after each
    while commits and (len(commits) > len(state.commits) or commits[-1] is not state.commits[len(commits) - 1]):
        commits.pop(), ends.pop()  # the state stepped back
    del spans[ends[-1] if ends else 0:]
    has_draft = bool(state.started.has_draft) if state.started else True
    for c in state.commits[len(commits):]:
        spans.extend(_commit_spans(c, state.blocks[c.block].verify, has_draft, show_rejected))
        commits.append(c)
        ends.append(len(spans))
    return spans


def _commit_spans(e: ev.Commit, v: ev.Verify | None, has_draft: bool, show_rejected: bool) -> list[str]:
    spans = []
    first_index = e.n_out - len(e.token_ids)  # output index of this commit's first token
    for i, (tid, kind, text) in enumerate(zip(e.token_ids, e.kinds, e.texts)):
        pos = first_index + i
        cls = token_class(kind, e.block, has_draft)
        conf = e.confidences[i] if i < len(e.confidences) else -1.0
        if cls == "correction" and v is not None and show_rejected:
            spans.extend(_rejected_spans(v))
        title = _token_title(cls, e.block, pos, conf, v, i, text)
        relaxed = cls in (ev.DRAFT, ev.COPY) and v is not None and i < len(v.relaxed) and v.relaxed[i]
        spans.append(_token_span(cls, text, title, " tok-relaxed" if relaxed else ""))
    return spans


def _rejected_spans(v: ev.Verify) -> list[str]:
    out = []
    a = v.accepted_len
    what, where = ("copied token", "block position") if v.source == ev.COPY else ("draft token", "draft position")
    for j in range(a, len(v.draft_tokens)):
        first = j == a
        why = (f"target wanted {quoted(v.target_texts[j])}" if first and j < len(v.target_texts)
               else "discarded: it follows the first rejection")
        title = f"block {v.block} · {where} {j + 1} · rejected {what} {quoted(v.draft_texts[j])} · {why}"
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
    if cls in (ev.DRAFT, ev.COPY):
        relaxed = i < len(v.relaxed) and v.relaxed[i]
        verdict = f"target's choice {target_choice}" + (" (accepted by the LOSSY threshold)" if relaxed else " ✓")
        if cls == ev.COPY:
            return f"{head} · block position {i + 1} · copied from an earlier occurrence in the context · {verdict}"
        return f"{head} · draft position {i + 1} · accepted draft token · draft confidence {conf:.2f} · {verdict}"
    if cls == "correction":
        proposed = quoted(v.draft_texts[i]) if i < len(v.draft_texts) else "?"
        who, where = ("the copy", "block position") if v.source == ev.COPY else ("the draft", "draft position")
        return (f"{head} · {where} {i + 1} · target's correction: {who} proposed {proposed}, "
                f"the target chose {quoted(text)}")
    verb = "copied" if v.source == ev.COPY else "drafted"
    return f"{head} · bonus token: all {len(v.draft_tokens)} {verb} tokens accepted, the target adds {quoted(text)}"


def legend_html(has_draft: bool = True, show_rejected: bool = True, copies: bool = False, lossy: bool = False) -> str:
    """`copies`: the run copies from the context (Request.lookup_ngram), so copied tokens get a legend entry;
    `lossy`: its acceptance threshold is below 1, so tokens accepted only by that threshold get one."""
    keys = ["draft", "correction", "bonus", "first"] if has_draft else ["target", "first"]
    if has_draft and show_rejected:
        keys.insert(2, "rejected")
    if has_draft and copies:
        keys.insert(1, "copy")
    if has_draft and lossy:
        keys.insert(1, "relaxed")
    classes = {"relaxed": "tok-draft tok-relaxed"}  # an accepted token's look plus the outline
    items = "".join(f'<li><span class="tok {classes.get(k, "tok-" + k)}">abc</span> {attr(TOKEN_STYLES[k][0])} '
                    f'<span class="cue">({attr(TOKEN_STYLES[k][1])})</span></li>' for k in keys)
    return f'<ul class="dfl-legend" aria-label="Legend">{items}</ul>'


def prompt_of(st: ev.Started | None) -> str:
    if st is None:
        return ""
    return st.request.get("prompt") or st.prompt_text


NO_RUN_YET = "Press Generate (or load a trace) to see tokens stream here."
NO_TOKENS_YET = "No tokens yet at this point of the run (the prompt is read first): step on, or wait for the first token."


def token_stream_html(run: RunState | list, show_rejected: bool = True, placeholder: str | None = None) -> str:
    """The answer as token spans and nothing else: while a run grows, each new value extends the previous one,
    so Gradio streams only the appended part (the page wraps it with TOKEN_TEMPLATE). Without tokens, `placeholder`
    (default: what to do when there is no run, or that a run has not reached its first token: a prefill, or
    step mode's first frame)."""
    state = as_state(run)
    spans = _spans(state, show_rejected)
    if spans:
        return "".join(spans)
    text = placeholder or (NO_TOKENS_YET if started(state) is not None else NO_RUN_YET)
    return f'<span class="dfl-placeholder">{attr(text)}</span>'


# The token stream component's frame: column-reverse keeps the newest tokens in view as the answer grows.
# Keyboard: Tab reaches the stream, ← → (Home, End) move through its tokens and show each one's details (layout.TOKEN_JS).
TOKEN_TEMPLATE = ('<div class="dfl-stream-scroll" tabindex="0" role="group" aria-label="Generated tokens: use the arrow '
                  'keys to read each token\'s details"><div class="dfl-stream">${value}</div></div>'
                  '<div class="tok-details" aria-live="polite">Hover over (or click) a token, or Tab to the text and use '
                  "← →: block, position, draft confidence and the target's choice.</div>")


def token_header_html(run: RunState | list, show_rejected: bool = True) -> str:
    """Legend (colour + non-colour cue for each kind present in this kind of run) and the prompt."""
    st = started(run)
    has_draft = bool(st.has_draft) if st else True
    copies = bool(st and st.request.get("lookup_ngram"))
    prompt = prompt_of(st)
    head = (f'<div class="dfl-prompt"><b>Prompt:</b> {attr(prompt[:400])}{"…" if len(prompt) > 400 else ""}</div>'
            if prompt else "")
    legend = legend_html(has_draft, show_rejected, copies, lossy=bool(st and st.lossy))
    return f'<div class="dfl-tokens-head">{legend}{head}</div>'


FINISH_WORDS = {"eos": "the model ended its answer", "length": "reached max new tokens", "stop": "hit a stop token",
                "cancelled": "stopped by the user", "timeout": "stopped at the per-request deadline",
                "error": "stopped by an error"}


def finish_words(fin: ev.Finished | None) -> str:
    if fin is None:
        return ""
    words = FINISH_WORDS.get(fin.reason, fin.reason)
    extra = f" — {fin.message}" if fin.message and fin.reason not in ("cancelled",) else ""
    return f"Finished ({fin.reason}): {words}{extra}."


def above(value: object, n: int) -> bool:
    """A count from a run's statistics above n: whether τ (n_verify > 0), a decode rate (n_output_tokens > 1) or a time
    to first token (> 0) is defined. A loaded trace's statistics are shown whatever they hold, so not a number: False."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > n


def run_stats(run: RunState | list) -> dict:
    """The run's statistics: Finished.stats when the run is over, else computed from the events so far."""
    fin = finished(run)
    if fin is not None and fin.stats:
        return fin.stats
    return run.stats() if isinstance(run, RunState) else compute_stats(run)
