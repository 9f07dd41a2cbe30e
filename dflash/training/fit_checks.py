"""`train fit`'s checks of its options against the data directories and the run in --out, made before the target
loads (a refusal takes a second), and what a resume reads back from the run: its config, corpus and vocabulary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from dflash.models.draft import build_target_layer_ids, read_draft_config
from dflash.errors import ModelLoadError, ValidationError
from dflash.training.corpus import feature_columns, split_last_layer
from dflash.training.fit_config import FitConfig, corpus_fingerprint, option

STATE_NAME = "trainer_state.safetensors"
# Options that change no weight (only when it is saved, measured or run): a resume may change them; others are refused.
FREE_ON_RESUME = ("out", "threads", "ckpt_every", "eval_every", "stop_at", "snapshot_base")
# The smallest --draft-vocab besides 0: room for trainable tokens beyond the stop ids a draft vocabulary always keeps.
MIN_DRAFT_VOCAB = 64


def is_resume(cfg: FitConfig) -> bool:
    """--out holds a trainer state: the run continues from it (its weights, moments, vocabulary, corpus)."""
    return (Path(cfg.out) / STATE_NAME).is_file()


def check_against_data(cfg: FitConfig, metas: list[dict]) -> list[int]:
    """The target layers to fuse (the z-lab rule for --layers unless --layer-ids), checked against what every data
    directory stores, and the other options the data bounds; before the target loads."""
    meta = metas[0]
    ids = cfg.target_layer_ids or build_target_layer_ids(meta["num_target_layers"], cfg.layers)
    for d, m in zip(cfg.data.split(","), metas):
        try:
            from_features, _ = split_last_layer(m["layer_ids"], ids, m["num_target_layers"])
            feature_columns(m["layer_ids"], from_features, m["hidden_size"])
        except ValueError as exc:
            raise ValidationError("--layer-ids" if cfg.target_layer_ids else "--layers", f"{d}: {exc}") from None
    vocab = meta["vocab_size"]
    if cfg.mask_token_id >= vocab:
        raise ValidationError("--mask-token-id", f"must be below the target's vocabulary size {vocab}, got {cfg.mask_token_id}")
    if cfg.init_from and not is_resume(cfg):  # a resume has the weights in its trainer state: --init-from is not read
        try:
            read_draft_config(cfg.init_from)
        except ModelLoadError as exc:
            raise ValidationError("--init-from", f"{cfg.init_from}: {str(exc).removeprefix('draft: ')}") from None
    if cfg.draft_vocab and not MIN_DRAFT_VOCAB <= cfg.draft_vocab <= vocab:
        raise ValidationError("--draft-vocab", f"must be 0 (the target's full vocabulary) or from {MIN_DRAFT_VOCAB} to the "
                                               f"target's vocabulary size {vocab}, got {cfg.draft_vocab}")
    return ids


def check_resume(cfg: FitConfig) -> None:
    """Refuse an --out whose checkpoint was trained with other settings (continuing it would train a mix of two
    runs, or fail on the weights' shapes) or on another corpus (the resume would not be exact), whose trainer state
    is unreadable, or that holds a draft without a trainer state (its first checkpoint would overwrite it); before
    the target loads."""
    stored, corpus = stored_config(Path(cfg.out))
    wanted = asdict(cfg)
    for key in (k for k in wanted if k in stored and k not in FREE_ON_RESUME):
        same = _paths(stored[key]) == _paths(wanted[key]) if key in ("data", "init_from") else stored[key] == wanted[key]
        if not same:
            hint = (f"; to stop earlier use --stop-at, to train on use another --out with --init-from {cfg.out}"
                    if key == "steps" else "")
            raise ValidationError(option(key), f"the checkpoint in --out was trained with {stored[key]!r}, not "
                                               f"{wanted[key]!r}; use the same value or another --out{hint}")
    if corpus is not None and corpus != corpus_fingerprint(cfg.data):
        raise ValidationError("--data", f"its shards changed since the run in {cfg.out} started (data grown or remade), "
                                        "so the resume would not be exact; train on it in another --out with "
                                        f"--init-from {cfg.out}")


def stored_config(out: Path) -> tuple[dict, dict | None]:
    """(the FitConfig as a dict, the corpus fingerprint or None) of the run in `out`: the trainer state's, else
    config.json's (a state saved before the state recorded it); ({}, None) for a new directory."""
    from safetensors import SafetensorError, safe_open

    state, config, stored, corpus = out / STATE_NAME, out / "config.json", None, None
    try:
        if state.is_file():
            with safe_open(str(state), "pt") as f:
                meta = f.metadata() or {}
            stored, corpus = json.loads(meta.get("config", "null")), json.loads(meta.get("corpus", "null"))
        if stored is None and config.is_file():
            stored = json.loads(config.read_text()).get("dflash_training")
            if stored is None:
                raise ValidationError("--out", f"{out} holds a draft that `train fit` did not make; start from it with "
                                               "--init-from and another --out")
            if not state.is_file() and "step" in stored:  # a snapshot, or a run whose state was deleted
                raise ValidationError("--out", f"{out} holds a draft trained to step {stored['step']} but no trainer state "
                                               f"({STATE_NAME}) to resume; continue from its weights with --init-from "
                                               f"{out} and another --out")
    except (SafetensorError, json.JSONDecodeError, OSError, AttributeError) as exc:
        raise ValidationError("--out", f"{out} holds an unreadable checkpoint ({exc}); delete it or use another --out") from None
    return stored or {}, corpus


def stored_vocab(out: Path) -> torch.Tensor | None:
    """The draft vocabulary a run's trainer state recorded (None for a state from before it did): a resume keeps
    it, so data or an --init-from draft changed since the start cannot change it."""
    from safetensors import safe_open

    with safe_open(str(out / STATE_NAME), "pt") as f:
        return f.get_tensor("vocab") if "vocab" in f.keys() else None  # noqa: SIM118 (a safetensors handle)


def _paths(value: str) -> list[str]:
    """Comma-separated directories, resolved: `data` and `./data/` are the same data."""
    return [str(Path(d).resolve()) for d in value.split(",")] if value else []
