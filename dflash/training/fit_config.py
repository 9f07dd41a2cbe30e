"""`train fit`'s options: `FitConfig`, checked when built, and the data directories' meta.json — no torch, so a
bad option is named before anything heavy is imported (`python -m dflash train fit --lr 0` answers at once)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from dflash.decode.request import MAX_NGRAM
from dflash.errors import ValidationError
from dflash.models.draft_check import MASK_TOKEN_ID
from dflash.training.data_config import shard_problem


@dataclass
class FitConfig:
    data: str
    out: str
    layers: int = 1
    target_layer_ids: list[int] = field(default_factory=list)  # default: the z-lab rule for `layers`
    block_size: int = 8
    gamma: float = 0.0  # 0: the paper's value for the block size
    steps: int = 2000
    seqs_per_step: int = 8
    anchors_per_seq: int = 16
    lr: float = 6e-4
    weight_decay: float = 0.01
    clip: float = 1.0
    partial_prob: float = 0.0
    kl_weight: float = 0.0
    draft_vocab: int = 8192  # 0: the full target vocabulary
    mask_token_id: int = MASK_TOKEN_ID
    intermediate_size: int = 0  # 0: the target's
    seed: int = 0
    ckpt_every: int = 250
    eval_every: int = 250
    holdout_shards: int = 1
    data_fraction: float = 1.0  # train on the first fraction of the training sequences (data-size ablation)
    threads: int = 0
    init_from: str = ""  # a draft directory to warm-start from (weights and draft vocabulary)
    residual_init: str = "normal"  # "zero": o_proj/down_proj start at 0 (step 0 output = the normed block embedding)
    onpolicy_blocks: int = 1  # 1: supervise a teacher-forced block only along the target's own path (objective.py)
    stop_at: int = 0  # stop after this step (checkpoint saved; the schedule is still that of `steps`); 0: at `steps`
    copy_weight: float = 1.0  # loss weight of blocks whose anchor ends an n-gram seen before (the chain copies those)
    copy_ngram: int = 2  # the n of copy_weight: Request.lookup_ngram of the chain the draft is trained for
    hint_ngram: int = 0  # > 0: a hinted draft (copy hints of n-grams up to this n; DraftConfig.hint_ngram)
    train_only: str = ""  # "hint": only the hint weights train (the rest as --init-from gave it)
    snapshot_base: int = 250  # keep a copy of the draft at steps base·2^k (log-spaced points of the τ curve); 0: off

    def __post_init__(self) -> None:
        """Bad values raise ValidationError naming the `train fit` option (one line from the CLI)."""
        if self.residual_init not in ("zero", "normal"):
            raise ValidationError("--residual-init", f"must be zero or normal, got {self.residual_init!r}")
        if self.train_only not in ("", "hint"):
            raise ValidationError("--train-only", f"must be hint (or left out), got {self.train_only!r}")
        if self.train_only and not (self.hint_ngram and self.init_from):
            raise ValidationError("--train-only", "hint trains a hinted draft's hint weights alone: it needs --hint-ngram "
                                                  "and --init-from")
        if not 0 <= self.hint_ngram <= MAX_NGRAM:
            raise ValidationError("--hint-ngram", f"must be in [0, {MAX_NGRAM}], got {self.hint_ngram}")
        if self.onpolicy_blocks not in (0, 1):
            raise ValidationError("--onpolicy-blocks", f"must be 0 or 1, got {self.onpolicy_blocks}")
        for name, lo in (("layers", 1), ("block_size", 2), ("steps", 1), ("seqs_per_step", 1), ("anchors_per_seq", 1),
                         ("ckpt_every", 1), ("eval_every", 1), ("draft_vocab", 0), ("mask_token_id", 0),
                         ("intermediate_size", 0), ("seed", 0), ("holdout_shards", 0), ("threads", 0), ("stop_at", 0),
                         ("snapshot_base", 0), ("copy_ngram", 1)):
            if getattr(self, name) < lo:
                raise ValidationError(option(name), f"must be >= {lo}, got {getattr(self, name)}")
        for name, lo, hi in (("gamma", 0.0, None), ("lr", None, None), ("weight_decay", 0.0, None), ("clip", None, None),
                             ("kl_weight", 0.0, None), ("partial_prob", 0.0, 1.0), ("data_fraction", None, 1.0),
                             ("copy_weight", 0.0, None)):
            _check_float(name, getattr(self, name), lo, hi)
        if self.stop_at > self.steps:  # the steps past --steps would run at learning rate 0
            raise ValidationError("--stop-at", f"must be <= --steps ({self.steps}), got {self.stop_at}")
        ids = self.target_layer_ids
        if min(ids, default=0) < 0 or len(set(ids)) != len(ids):
            raise ValidationError("--layer-ids", f"must be distinct layer indices >= 0, got {','.join(map(str, ids))}")


def _check_float(name: str, value: float, lo: float | None, hi: float | None) -> None:
    """lo None: must be > 0; else >= lo. hi None: no upper bound."""
    ok = math.isfinite(value) and (value > 0 if lo is None else value >= lo) and (hi is None or value <= hi)
    if not ok:
        bound = ("> 0" if lo is None else f">= {lo}") + ("" if hi is None else f" and <= {hi}")
        raise ValidationError(option(name), f"must be {bound}, got {value}")


def option(name: str) -> str:
    """The `train fit` option of a FitConfig field."""
    return "--layer-ids" if name == "target_layer_ids" else "--" + name.replace("_", "-")


# meta.json keys that say which target made the data: directories made for different targets cannot be mixed.
TARGET_KEYS = ("target", "hidden_size", "num_target_layers", "vocab_size")


def read_data_meta(data: str) -> list[dict]:
    """meta.json of every comma-separated data directory, read before the target loads; each must hold shards, and
    all must come from the same target (their features have its shape)."""
    metas = []
    for d in data.split(","):
        path = Path(d) / "meta.json"
        if not Path(d).is_dir():
            raise ValidationError("--data", f"{d} {'is not a directory' if Path(d).exists() else 'does not exist'}: give "
                                            "directories made by `train data` or `train data-tf`")
        if not path.is_file():
            raise ValidationError("--data", f"{d} has no meta.json: give directories made by `train data` or `train data-tf`")
        if not any(Path(d).glob("shard_*.safetensors")):  # a run that selected no sequence, or one stopped at once
            raise ValidationError("--data", f"{d} holds no shards; make them with `train data` or `train data-tf`")
        try:
            metas.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ValidationError("--data", f"{d}/meta.json is unreadable ({exc})") from None
        for shard in sorted(Path(d).glob("shard_*.safetensors")):
            if problem := shard_problem(shard):
                raise ValidationError("--data", f"{shard} is {problem}; run the `train data` or `train data-tf` command "
                                                f"that made {d} again: it makes such a shard again")
    dirs = data.split(",")
    for d, meta in zip(dirs[1:], metas[1:]):
        for key in (k for k in TARGET_KEYS if meta.get(k) != metas[0].get(k)):
            raise ValidationError("--data", f"{d} was made for another target than {dirs[0]} ({key} {meta.get(key)!r}, "
                                            f"not {metas[0].get(key)!r}); give directories made with the same --target")
    return metas


def corpus_fingerprint(data: str) -> dict[str, list]:
    """What a resume checks is the corpus it started on: per data directory, each shard's name and size. Data grown
    by `train data --prompts` or `data-tf --conversations` changes it (new shards, a remade last window)."""
    return {str(Path(d).resolve()): [[p.name, p.stat().st_size] for p in sorted(Path(d).glob("shard_*.safetensors"))]
            for d in data.split(",")}
