"""Options of `train data` and `train data-tf`, checked before any model loads, and the rule for resuming a data
directory: its shards are kept only if this run would make them with the same settings (recorded in meta.json),
and a shard only if it holds the sequences this run plans for its slot.

Every bad value raises `ValidationError` naming the command-line option, so the CLI prints one line (exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dflash.errors import ValidationError, first_line

DEFAULT_LAYERS = (1, 8, 14, 15, 21, 27)  # a superset, so drafts of 1-3 layers can be ablated on one data set
WINDOW_BATCHES = 32  # length-sorting window, in batches (see data.sort_in_windows)
TURNS = ("first", "later", "all")
# meta.json key → the option that sets it (for the refusal message).
OPTIONS = {"kind": "--out", "target": "--target", "layer_ids": "--layers", "prompts": "--prompts",
           "conversations": "--conversations", "batch_size": "--batch-size", "max_prompt_tokens": "--max-prompt-tokens",
           "min_prompt_tokens": "--min-prompt-tokens", "max_new_tokens": "--max-new-tokens",
           "max_response_tokens": "--max-response-tokens", "sampled_every": "--sampled-every",
           "temperature": "--temperature", "seed": "--seed", "turns": "--turns", "sort_window_batches": "--out"}
COUNTS = ("prompts", "conversations")  # may grow on a resume (more shards), never shrink (see check_resume)
# meta.json files from older versions lack some keys: absent ones are not compared (the shard check below still
# makes again every shard that does not hold what this run plans), except `kind`, which `train data` once omitted.
LEGACY = {"kind": "generated"}


def parse_layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValidationError("--layers", f"must be comma-separated integers, got {text!r}") from None


def _at_least(option: str, value: int | None, lo: int) -> None:
    if value is not None and value < lo:
        raise ValidationError(option, f"must be >= {lo}, got {value}")


def _check_layers(layers: tuple[int, ...]) -> None:
    if not layers or min(layers) < 0 or len(set(layers)) != len(layers):
        raise ValidationError("--layers", f"must be distinct layer indices >= 0, got {','.join(map(str, layers)) or 'none'}")


def check_layers_exist(layers: tuple[int, ...] | list[int], num_layers: int) -> None:
    """After the target loads (its depth is known only then)."""
    if max(layers) >= num_layers:
        raise ValidationError("--layers", f"the target has {num_layers} layers (0 to {num_layers - 1}), got {max(layers)}")


def generation_settings(target: str, layer_ids, batch_size: int, max_new_tokens: int, sampled_every: int,
                        temperature: float, seed: int) -> dict:
    """meta.json keys of `train data` that decide what a shard's responses and features are."""
    return {"kind": "generated", "target": target, "layer_ids": list(layer_ids), "batch_size": batch_size,
            "max_new_tokens": max_new_tokens, "sampled_every": sampled_every, "temperature": temperature, "seed": seed}


@dataclass(frozen=True)
class DataConfig:
    """`train data`: regenerate ShareGPT responses with the target."""

    target: str
    out: str
    prompts: int = 2000
    layers: tuple[int, ...] = DEFAULT_LAYERS
    batch_size: int = 32
    max_prompt_tokens: int = 256
    max_new_tokens: int = 192
    sampled_every: int = 4
    temperature: float = 0.7
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        _check_layers(self.layers)
        for option, value, lo in (("--prompts", self.prompts, 1), ("--batch-size", self.batch_size, 1),
                                  ("--max-prompt-tokens", self.max_prompt_tokens, 1),
                                  ("--max-new-tokens", self.max_new_tokens, 1), ("--sampled-every", self.sampled_every, 0),
                                  ("--seed", self.seed, 0), ("--threads", self.threads, 1)):
            _at_least(option, value, lo)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValidationError("--temperature", f"must be a finite number >= 0, got {self.temperature}")

    def settings(self) -> dict:
        return generation_settings(self.target, self.layers, self.batch_size, self.max_new_tokens, self.sampled_every,
                                   self.temperature, self.seed) | self.selection()

    def selection(self) -> dict:
        """meta.json keys that decide which prompts exist and which shard slot holds each."""
        return {"prompts": self.prompts, "max_prompt_tokens": self.max_prompt_tokens, "sort_window_batches": WINDOW_BATCHES}


@dataclass(frozen=True)
class TeacherForcedConfig:
    """`train data-tf`: one teacher-forced target pass over ShareGPT's recorded replies."""

    target: str
    out: str
    conversations: int = 4000
    layers: tuple[int, ...] = DEFAULT_LAYERS
    batch_size: int = 16
    max_prompt_tokens: int = 160
    max_response_tokens: int = 256
    threads: int | None = None
    turns: str = "first"
    min_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        _check_layers(self.layers)
        for option, value, lo in (("--conversations", self.conversations, 1), ("--batch-size", self.batch_size, 1),
                                  ("--max-response-tokens", self.max_response_tokens, 1), ("--threads", self.threads, 1)):
            _at_least(option, value, lo)
        _at_least("--max-prompt-tokens", self.max_prompt_tokens, 1)  # before the range, which names --min-prompt-tokens
        if not 0 <= self.min_prompt_tokens < self.max_prompt_tokens:
            raise ValidationError("--min-prompt-tokens", "must be >= 0 and below --max-prompt-tokens")
        if self.turns not in TURNS:
            raise ValidationError("--turns", f"must be one of {', '.join(TURNS)}, got {self.turns!r}")

    def settings(self) -> dict:
        return {"kind": "teacher-forced", "target": self.target, "layer_ids": list(self.layers),
                "conversations": self.conversations, "batch_size": self.batch_size, "turns": self.turns,
                "min_prompt_tokens": self.min_prompt_tokens, "max_prompt_tokens": self.max_prompt_tokens,
                "max_response_tokens": self.max_response_tokens, "sort_window_batches": WINDOW_BATCHES}


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _refusal(key: str, stored, wanted) -> ValidationError:
    if key == "kind":
        return ValidationError("--out", f"it holds {stored} data, this command makes {wanted} data; use another --out")
    if key == "sort_window_batches":
        return ValidationError("--out", "its shards were ordered by another version of this command; use another --out")
    if key in COUNTS:
        return ValidationError(OPTIONS[key], f"the shards in --out were made with {stored}; a smaller count would leave "
                                             f"shards this run does not plan in the corpus; use >= {stored} or another --out")
    return ValidationError(OPTIONS.get(key, "--out"), f"the shards in --out were made with {_show(stored)}, not "
                                                      f"{_show(wanted)}; use the same value or another --out")


RUN_NAMES = ("trainer_state.safetensors", "train_log.jsonl", "runs.jsonl", "config.json", "model.safetensors",
             "draft_vocab.safetensors", "snapshots")  # what `train fit` writes in its --out; a model or draft has config.json


def check_out(out: str | Path) -> None:
    """--out is a directory the run writes (made if missing): an existing file there is refused up front."""
    if Path(out).exists() and not Path(out).is_dir():
        raise ValidationError("--out", f"{out} is a file; give a directory")


def _names(out: str | Path) -> list[str]:
    return sorted(p.name for p in Path(out).iterdir()) if Path(out).is_dir() else []


def _is_data(name: str) -> bool:
    return name in ("meta.json", "meta.json.tmp") or (name.startswith("shard_") and name.endswith((".safetensors", ".tmp")))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_data_out(out: str | Path) -> None:
    """`train data`/`data-tf`'s --out: new, empty, or data those commands made. A draft or a `train fit` run (--out
    and --data mixed up) and a directory of other files are refused before the model loads: writing shards beside
    them would make one directory both."""
    check_out(out)
    names = _names(out)
    if any(n in RUN_NAMES for n in names):
        raise ValidationError("--out", f"{out} holds a model, a draft or a `train fit` run, not training data; give a new "
                                       "directory")
    if other := [n for n in names if not _is_data(n)]:
        raise ValidationError("--out", f"{out} holds files that `train data` did not make ({_listed(other)}); give a new "
                                       "or empty directory")


def check_run_out(out: str | Path) -> None:
    """`train fit`'s --out: new, empty, or a run it made (then resumed). Training data (--data and --out mixed up)
    and a directory of other files are refused before the target loads."""
    check_out(out)
    names = _names(out)
    if any(_is_data(n) for n in names):
        raise ValidationError("--out", f"{out} holds training data (meta.json, shards), not a run; give --out a new "
                                       "directory (the data goes to --data)")
    if names and not any(n in RUN_NAMES for n in names):
        raise ValidationError("--out", f"{out} holds files that `train fit` did not make ({_listed(names)}); give a new "
                                       "or empty directory")


def check_resume(out_dir: str | Path, settings: dict) -> None:
    """Refuse to resume `out_dir` when shards there were made with other settings (a count may only grow), or an
    `out_dir` that is not for data (`check_data_out`)."""
    out = Path(out_dir)
    check_data_out(out)
    if not any(out.glob("shard_*.safetensors")):
        return
    if not (out / "meta.json").is_file():
        raise ValidationError("--out", "it holds shards but no meta.json, so their settings are unknown; use another --out")
    stored = LEGACY | json.loads((out / "meta.json").read_text())
    for key, wanted in settings.items():
        if key in stored and (stored[key] > wanted if key in COUNTS else stored[key] != wanted):
            raise _refusal(key, stored[key], wanted)


def write_meta(out_dir: str | Path, settings: dict, model_config) -> None:
    """meta.json: the settings (checked by `check_resume` first) and what the corpus reader needs of the target."""
    meta = {**settings, "hidden_size": model_config.hidden_size, "num_target_layers": model_config.num_hidden_layers,
            "vocab_size": model_config.vocab_size}
    tmp = Path(out_dir, "meta.json.tmp")  # written whole, then renamed: a kill mid-write leaves the old one intact
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(Path(out_dir, "meta.json"))


def shard_problem(path: Path) -> str | None:
    """Why a shard cannot be read (a copy or a disk cut short: its header spans the whole file), or None; reads the
    header only, without torch. `train fit` names such a shard; a resumed data run makes it again."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy"):
            return None
    except (SafetensorError, OSError) as exc:
        return f"unreadable or truncated ({first_line(exc)})"


def stored_rows(path: Path) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) of every sequence in a shard: what a resume compares with its plan."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        ids, off, plens = f.get_tensor("input_ids"), f.get_tensor("offsets").tolist(), f.get_tensor("prompt_lens").tolist()
    return [(ids[a:b].tolist(), int(p)) for a, b, p in zip(off, off[1:], plens)]
