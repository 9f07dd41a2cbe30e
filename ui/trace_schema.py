"""What a trace file may contain: a rule for every field of every event (type and range), the order of one run's
events, and the bounds of an upload.

Traces are shared between people, so nothing in one is trusted: `check_event` turns one JSON object into an event
or raises TraceError naming the place (`events[12] (Verify)`, `line 13 (Verify)`) and the field. The messages are
shown in the page, so they never repeat text from the file unless it is plain (letters, digits, a few signs).
The bounds follow from the request limits: a trace can hold no more than the engine could have produced.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from dflash.decode import events as ev
from dflash.decode.attention import MAX_TOP_K
from dflash.errors import ValidationError
from dflash.decode.request import (MAX_BLOCK_SIZE, MAX_DEADLINE_S, MAX_NEW_TOKENS, MAX_NGRAM, MAX_PROMPT_TOKENS, MAX_STEPS,
                                   Request)
from dflash.decode.stats import LATER_STATS, compute_stats
from dflash.verification.verify import NO_GAP

MAX_TRACE_BYTES = 20 * 1024 * 1024
# Per run: Started, Prefill, the first Commit and Finished, then per block (at most one per new token) BlockSize,
# at most MAX_STEPS DraftSteps, Verify and Commit.
MAX_RUN_EVENTS = 4 + MAX_NEW_TOKENS * (3 + MAX_STEPS)
MAX_TRACE_EVENTS = MAX_RUN_EVENTS + 4 + 3 * MAX_NEW_TOKENS  # the run and its no-draft baseline (3 events a token)
MAX_TOKEN_ID = 2**31 - 1
MAX_POSITION = MAX_PROMPT_TOKENS + MAX_NEW_TOKENS + MAX_BLOCK_SIZE  # an absolute position in the sequence
MAX_MS = int(MAX_DEADLINE_S * 1000)  # the longest deadline a request may set
MAX_LABEL_CHARS = 1_000  # a token's text, a controller's reason, a model name, a meta value
MAX_TEXT_CHARS = 200_000  # a prompt, an answer, a message

MAX_JSON_DEPTH = 100  # a trace nests 5 levels deep; Python's reader gives up near 1,000 levels (RecursionError)

_PLAIN = re.compile(r"[\w .,:;+\-/()]{0,40}")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message is safe to show."""


def shown(value: Any) -> str:
    """A value from the file as an error message may quote it: plain short text and numbers as they are (JSON
    spelling), anything else described."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if abs(value) < 10**15 else "a very large number"
    if isinstance(value, float):
        return json.dumps(value)  # NaN, Infinity, -Infinity as JSON spells them
    if isinstance(value, str):
        return json.dumps(value) if _PLAIN.fullmatch(value) else f"text of {len(value)} characters"
    return f"a list of {len(value)}" if isinstance(value, list) else "an object" if isinstance(value, dict) else "a value"


# -- JSON text -----------------------------------------------------------------------------------------------------
class JsonProblem(NamedTuple):
    """Why a JSON text did not decode, and the line (1-based, of the text given) where it went wrong."""
    reason: str
    line: int
    more: bool = False  # one value was read and more text follows it: JSON lines, maybe


def decode_json(text: str) -> Any:
    """`text`'s one JSON value, or a JsonProblem naming the line and the reason (a syntax error, too deep, a
    number too long to read)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return JsonProblem(f"{exc.msg.lower()} at column {exc.colno}", exc.lineno, exc.msg == "Extra data")
    except RecursionError:
        deep = _too_deep(text)
        return JsonProblem(f"nested more than {MAX_JSON_DEPTH} levels deep", line_of(text, deep or 0))
    except ValueError:  # int() refuses more than 4,300 digits
        long = re.search(r"\d{4301}", text)
        return JsonProblem("a number of more than 4300 digits", line_of(text, long.start() if long else 0))


def line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _too_deep(text: str) -> int | None:
    """Where `text`'s brackets (outside strings) first nest more than MAX_JSON_DEPTH deep."""
    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        c = m.group()
        depth += 1 if c in "[{" else -1 if c in "]}" else 0
        if depth > MAX_JSON_DEPTH:
            return m.start()
    return None


# -- field rules: rule(value, name) -> None when valid, else the message ----------------------------------------
Rule = Callable[[Any, str], str | None]


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")  # a lone surrogate ("\ud800" in JSON) cannot be sent to the page
        return True
    except UnicodeEncodeError:
        return False


def _is_int(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _is_number(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: type(v) in (int, float) and lo <= v <= hi  # NaN and infinities fail the comparison


def _is_text(limit: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is str and len(v) <= limit and _utf8(v)


def scalar(ok: Callable[[Any], bool], what: str) -> Rule:
    return lambda v, name: None if ok(v) else f"'{name}' must be {what}, got {shown(v)}"


def listed(ok: Callable[[Any], bool], what: str, max_len: int) -> Rule:
    def rule(v: Any, name: str) -> str | None:
        if type(v) is list and len(v) <= max_len and all(ok(x) for x in v):
            return None
        return f"'{name}' must be a list of {what}, at most {max_len} of them"
    return rule


def optional(ok: Callable[[Any], bool], what: str) -> Rule:
    return scalar(lambda v: v is None or ok(v), f"{what} or null")


def optional_list(rule: Rule) -> Rule:
    def either(v: Any, name: str) -> str | None:
        problem = None if v is None else rule(v, name)
        return problem and f"{problem}, or null"
    return either


def integer(lo: int, hi: int) -> Rule:
    return scalar(_is_int(lo, hi), f"an integer in [{lo}, {hi}]")


def number(lo: float, hi: float) -> Rule:
    return scalar(_is_number(lo, hi), f"a finite number in [{lo}, {hi}]")


def text(limit: int) -> Rule:
    return scalar(_is_text(limit), f"text of at most {limit} characters")


def one_of(names: tuple[str, ...]) -> Rule:
    return scalar(lambda v: type(v) is str and v in names, f"one of {', '.join(names)}")


def request_rule(v: Any, name: str) -> str | None:
    """The recorded request must be one the engine accepts: the request's own rules decide."""
    if type(v) is not dict:
        return f"'{name}' must be an object, got {shown(v)}"
    unknown = set(v) - {f.name for f in dataclasses.fields(Request)}
    if unknown:
        return f"'{name}' has unknown fields ({len(unknown)})"
    lo, block = v.get("min_block_size"), v.get("block_size")
    if type(lo) is int and type(block) is int and block < lo:
        # Recorded before a block size below the minimum was refused: the engine then lowered the minimum to it.
        v = {**v, "min_block_size": block}
    try:
        Request(**v)
    except ValidationError as exc:
        rule = str(exc).removeprefix(f"{exc.param}: ").split(", got ")[0]
        return f"'{name}.{exc.param}' {rule}, got {shown(v.get(exc.param))}"
    except (TypeError, ValueError):
        return f"'{name}' is not a valid request"
    return None


FLAG = scalar(lambda v: type(v) is bool, "true or false")
OBJECT = scalar(lambda v: type(v) is dict, "an object")
BLOCK = integer(0, MAX_NEW_TOKENS)
SIZE = integer(1, MAX_BLOCK_SIZE)
POSITION = integer(0, MAX_POSITION)
MS = number(0, MAX_MS)
LABEL = text(MAX_LABEL_CHARS)
TEXT = text(MAX_TEXT_CHARS)
IDS = listed(_is_int(0, MAX_TOKEN_ID), f"integers in [0, {MAX_TOKEN_ID}]", MAX_BLOCK_SIZE)
TEXTS = listed(_is_text(MAX_LABEL_CHARS), f"text of at most {MAX_LABEL_CHARS} characters", MAX_BLOCK_SIZE)
FLAGS = listed(lambda v: type(v) is bool, "true or false", MAX_BLOCK_SIZE)
SOURCE = one_of(ev.BLOCK_SOURCES)
KINDS = listed(lambda v: type(v) is str and v in ev.TOKEN_KINDS, " or ".join(ev.TOKEN_KINDS), MAX_BLOCK_SIZE)

# What the draft attends to (DraftStep.attention, trace version 2; dflash/decode/attention.py).
MAX_DRAFT_LAYERS, MAX_HEADS = 64, 256
ATTENTION_KEYS = {"anchor", "context_len", "top_k", "heads", "ctx_positions", "ctx_texts", "layers"}
LAYER_KEYS = {"ctx_pos", "ctx_w", "ctx_share", "block", "head_ctx_share"}
_WEIGHT = _is_number(0.0, 1.0)


def _rows(v: Any, n_rows: int, n_cols: int, ok: Callable[[Any], bool]) -> bool:
    """`v` is n_rows lists of n_cols values, each `ok`."""
    return (type(v) is list and len(v) == n_rows
            and all(type(r) is list and len(r) == n_cols and all(ok(x) for x in r) for r in v))


def attention_rule(v: Any, name: str) -> str | None:
    """null, or a summary as `dflash.decode.attention.summarize` writes it, every size within its bounds."""
    what = f"'{name}' must be null or the draft's attention record (dflash/decode/attention.py)"
    if v is None:
        return None
    if type(v) is not dict or set(v) != ATTENTION_KEYS or type(v["layers"]) is not list:
        return what
    ctx, k, heads, layers = v["context_len"], v["top_k"], v["heads"], v["layers"]
    if not (_is_int(0, MAX_POSITION)(v["anchor"]) and _is_int(0, MAX_POSITION)(ctx) and _is_int(0, MAX_TOP_K)(k)
            and k <= ctx and _is_int(1, MAX_HEADS)(heads) and 1 <= len(layers) <= MAX_DRAFT_LAYERS):
        return f"{what}: a size is out of range"
    kept = v["ctx_positions"]
    if (type(kept) is not list or len(kept) > ctx or not all(_is_int(0, ctx - 1)(p) for p in kept)
            or kept != sorted(set(kept)) or listed(_is_text(MAX_LABEL_CHARS), "", len(kept))(v["ctx_texts"], "")
            or len(v["ctx_texts"]) != len(kept)):
        return f"{what}: 'ctx_positions' must be ascending context positions, with one text each in 'ctx_texts'"
    first = layers[0].get("block") if type(layers[0]) is dict else None
    b = len(first) if type(first) is list and 1 <= len(first) <= MAX_BLOCK_SIZE else 0
    known = set(kept)
    for i, layer in enumerate(layers):
        if not (type(layer) is dict and set(layer) == LAYER_KEYS and b and _rows(layer["block"], b, b, _WEIGHT)
                and _rows(layer["ctx_pos"], b, k, lambda p: type(p) is int and p in known)
                and _rows(layer["ctx_w"], b, k, _WEIGHT) and _rows([layer["ctx_share"]], 1, b, _WEIGHT)
                and _rows(layer["head_ctx_share"], heads, b, _WEIGHT)):
            return f"{what}: layer {i} does not have one row per block slot, of 'top_k' context positions each"
    return None

FIELD_RULES: dict[str, dict[str, Rule]] = {
    "Started": {"request": request_rule, "prompt_ids": listed(_is_int(0, MAX_TOKEN_ID), "integers", MAX_PROMPT_TOKENS),
                "prompt_text": TEXT, "has_draft": FLAG, "lossy": FLAG, "model": LABEL,
                "mask_token_id": optional(_is_int(0, MAX_TOKEN_ID), f"an integer in [0, {MAX_TOKEN_ID}]"),
                "trained_block_size": optional(_is_int(1, MAX_BLOCK_SIZE), f"an integer in [1, {MAX_BLOCK_SIZE}]")},
    "Prefill": {"n_prompt_tokens": integer(0, MAX_PROMPT_TOKENS), "ms": MS},
    "BlockSize": {"block": BLOCK, "size": SIZE, "reason": LABEL, "source": SOURCE},
    "DraftStep": {"block": BLOCK, "step": integer(0, MAX_STEPS - 1), "n_steps": integer(1, MAX_STEPS), "start": POSITION,
                  "tokens": IDS, "token_texts": TEXTS, "masked": FLAGS, "committed": FLAGS, "ms": MS,
                  "attention": attention_rule, "hints": optional_list(IDS), "hint_texts": optional_list(TEXTS),
                  "hint_n": optional_list(listed(_is_int(0, MAX_NGRAM), f"integers in [0, {MAX_NGRAM}]", MAX_BLOCK_SIZE)),
                  "confidences": listed(_is_number(0.0, 1.0), "finite numbers in [0.0, 1.0]", MAX_BLOCK_SIZE)},
    "Verify": {"block": BLOCK, "start": POSITION, "block_size": SIZE, "draft_tokens": IDS, "draft_texts": TEXTS,
               "target_tokens": IDS, "target_texts": TEXTS, "accepted": FLAGS, "accepted_len": integer(0, MAX_BLOCK_SIZE - 1),
               "next_token": integer(0, MAX_TOKEN_ID), "draft_ms": MS, "verify_ms": MS, "relaxed": FLAGS,
               "source": SOURCE},
    "Commit": {"block": BLOCK, "token_ids": IDS, "kinds": KINDS, "texts": TEXTS, "text_delta": TEXT,
               "n_out": integer(0, MAX_NEW_TOKENS), "target_tokens": IDS, "t_ms": MS,
               "confidences": listed(_is_number(-1.0, 1.0), "finite numbers in [-1.0, 1.0]", MAX_BLOCK_SIZE),
               "target_gaps": listed(_is_number(0.0, NO_GAP), f"finite numbers in [0.0, {NO_GAP:.4g}]", MAX_BLOCK_SIZE)},
    "Finished": {"reason": one_of(ev.FINISH_REASONS), "text": TEXT, "stats": OBJECT, "message": TEXT,
                 "output_ids": listed(_is_int(0, MAX_TOKEN_ID), "integers", MAX_NEW_TOKENS)},
}
REQUIRED = {name: {f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
            for name, cls in ev.EVENT_TYPES.items()}


# -- agreement between the fields of one event ---------------------------------------------------------------------
def _draft_step(e: ev.DraftStep) -> str | None:
    n = len(e.tokens)
    for name in ("token_texts", "confidences", "masked", "committed"):
        if len(getattr(e, name)) != n:
            return f"'{name}' must have one entry per block position (as 'tokens')"
    for name in ("hints", "hint_texts", "hint_n"):
        if getattr(e, name) is not None and len(getattr(e, name)) != n:
            return f"'{name}' must be null or have one entry per block position (as 'tokens')"
    a = e.attention
    if a is not None and (len(a["layers"][0]["block"]) != n or a["anchor"] != e.start):
        return "'attention' must have one row per block position and its anchor at 'start'"
    return "'step' must be less than 'n_steps'" if e.step >= e.n_steps else None


def _verify(e: ev.Verify) -> str | None:
    n = len(e.draft_tokens)
    if e.block_size != n + 1:
        return "'block_size' must be the number of drafted tokens plus one"
    for name in ("draft_texts", "accepted"):
        if len(getattr(e, name)) != n:
            return f"'{name}' must have one entry per drafted token"
    for name in ("target_tokens", "target_texts"):
        if len(getattr(e, name)) != n + 1:
            return f"'{name}' must have one entry per drafted token, plus one"
    if e.accepted_len > n:
        return "'accepted_len' must be at most the number of drafted tokens"
    return "'relaxed' must have at most one entry per drafted token" if len(e.relaxed) > n else None


def _commit(e: ev.Commit) -> str | None:
    n = len(e.token_ids)
    for name in ("kinds", "texts"):
        if len(getattr(e, name)) != n:
            return f"'{name}' must have one entry per token"
    for name in ("confidences", "target_tokens", "target_gaps"):
        if len(getattr(e, name)) not in (0, n):
            return f"'{name}' must be empty or have one entry per token"
    return "'n_out' must count at least this commit's tokens" if e.n_out < n else None


AGREEMENT: dict[type, Callable[[Any], str | None]] = {ev.DraftStep: _draft_step, ev.Verify: _verify, ev.Commit: _commit}


def check_event(d: Any, where: str) -> ev.Event:
    """One JSON object → an event whose every field has its type and range; TraceError names the place."""
    kind = d.get("type") if isinstance(d, dict) else None
    if type(kind) is not str or kind not in ev.EVENT_TYPES:
        raise TraceError(f"trace: {where} is not a DFlash event (type {shown(kind if isinstance(d, dict) else d)})")
    fields = {k: v for k, v in d.items() if k != "type"}
    rules = FIELD_RULES[kind]
    if not REQUIRED[kind] <= fields.keys() <= rules.keys():
        raise TraceError(f"trace: {where} has missing or unknown fields for a {kind} event")
    for name, value in fields.items():
        problem = rules[name](value, name)
        if problem:
            raise TraceError(f"trace: {where} ({kind}): {problem}")
    event = ev.EVENT_TYPES[kind](**fields)
    problem = AGREEMENT[type(event)](event) if type(event) in AGREEMENT else None
    if problem:
        raise TraceError(f"trace: {where} ({kind}): {problem}")
    return event


# -- one run -------------------------------------------------------------------------------------------------------
_PHASE = {ev.BlockSize: 0, ev.DraftStep: 1, ev.Verify: 2, ev.Commit: 3}


def check_run(events: list, places: list[str], what: str) -> list:
    """The grammar of one run (see dflash/decode/events.py): Started first and once, Finished last, each block's events in
    the order BlockSize, DraftStep…, Verify, Commit (one each but the steps), blocks never going back, and the
    recorded statistics those of the events. Returns the events, an older trace's statistics completed with those
    added since (`LATER_STATS`)."""
    if not events or not isinstance(events[0], ev.Started):
        raise TraceError(f"trace: the first {what} must be Started")
    if any(isinstance(e, ev.Started) for e in events[1:]):
        raise TraceError("trace: holds more than one run")
    if any(isinstance(e, ev.Finished) for e in events[:-1]):
        raise TraceError("trace: events after Finished")
    last, verified = (-1, 3), -1
    for e, where in zip(events, places):
        phase = _PHASE.get(type(e))
        if phase is None:
            continue
        key = (e.block, phase)
        if key < last or (key == last and phase != 1) or (phase == 3 and e.block > 0 and verified != e.block):
            raise TraceError(f"trace: {where} ({type(e).__name__}): comes out of order (a block's events run BlockSize, "
                             "DraftStep…, Verify, Commit, and blocks never go back)")
        last, verified = key, e.block if phase == 2 else verified
    fin = events[-1]
    if isinstance(fin, ev.Finished) and fin.stats:
        computed = compute_stats(events[:-1])
        if fin.stats != _recorded_as(fin.stats, computed):
            raise TraceError(f"trace: {places[-1]} (Finished): 'stats' does not match the run's events "
                             "(leave it empty to have it computed)")
        events = events[:-1] + [dataclasses.replace(fin, stats=computed)]
    return events


def _recorded_as(recorded: dict, computed: dict) -> dict:
    """`computed` without the statistics a trace recorded before they existed (`LATER_STATS`), when it lacks them."""
    return {k: v for k, v in computed.items() if k in recorded or k not in LATER_STATS}


def check_meta(meta: dict) -> dict[str, Any]:
    """Scalar entries only (others are dropped, as before); text within MAX_LABEL_CHARS."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if not (isinstance(v, (str, int, float, bool)) or v is None) or not _utf8(str(k)):
            continue
        if isinstance(v, str):
            problem = LABEL(v, f"meta.{k}" if _PLAIN.fullmatch(str(k)) else "meta")
            if problem:
                raise TraceError(f"trace: {problem}")
        out[str(k)[:40]] = v
    return out
