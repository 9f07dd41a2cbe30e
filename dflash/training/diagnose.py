"""What limits the draft, measured on stored data (the shards of `train data-tf` or `train data`).

Every measure is taken on the same held-out anchors a (response positions with a full block after them); the label
of block slot k is the target's own token at a+k.
- Baselines without a model: bigram and trigram tables built from the training shards (the anchor, or the token
  before it and the anchor, → the target's most frequent next token) and prompt lookup with n = 1..3 (copy the
  token that followed the last earlier occurrence of the last n tokens): the share of anchors each gets right.
- The draft: per-slot accuracy, unconditional (slot k right, counted where slot k's label is on the target's
  path) and as an accepted prefix (slots 1..k all right: what τ is made of).
- A probe pair for slot 1, trained on the same anchors with the same budget (`probes.py`): what a masked slot of a
  one-layer draft can compute, against the same plus a lookup whose query knows the anchor.

`python -m dflash train diagnose --data DIR --draft DIR --out FILE.json` (summary on stderr).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dflash.errors import ValidationError
from dflash.decode.lookup import NgramIndex
from dflash.training.corpus import Corpus, Sequence
from dflash.training.objective import AnchorHints, block_attention_mask, block_embeds, on_policy_prefix
from dflash.training.probes import anchors_of, train_probe_pair

log = logging.getLogger("dflash.train")
LOOKUP_NS = (1, 2, 3)


@dataclass(frozen=True)
class DiagnoseConfig:
    data: str
    draft: str
    out: str
    holdout_shards: int = 4
    probe_steps: int = 600
    probe_seqs: int = 8
    seed: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        for name in ("holdout_shards", "probe_steps", "probe_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"--{name.replace('_', '-')}", f"must be a whole number >= 1, got {value!r}")
        if not Path(self.draft).is_dir():
            raise ValidationError("--draft", f"{self.draft} is not a draft directory")


class NextTokenTable:
    """The target's most frequent next token after a key of the `order` last tokens (1: bigram, 2: trigram)."""

    def __init__(self, order: int, seqs: list[Sequence]):
        self.order = order
        counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for s in seqs:
            ids, labels = s.ids.tolist(), s.labels.tolist()
            for a in range(max(s.prompt_len, order - 1), len(s) - 1):
                counts[tuple(ids[a - order + 1 : a + 1])][labels[a + 1]] += 1
        self.best = {k: c.most_common(1)[0][0] for k, c in counts.items()}

    def predict(self, ids: list[int], a: int) -> int | None:
        return self.best.get(tuple(ids[a - self.order + 1 : a + 1])) if a >= self.order - 1 else None


def baseline_rows(heldout: list[Sequence], train: list[Sequence], block: int) -> dict[str, dict]:
    """Per baseline: anchors, how many got a proposal (`covered`) and how many were right (`right`)."""
    tables = {"bigram": NextTokenTable(1, train), "trigram": NextTokenTable(2, train)}
    rows = {name: Counter() for name in [*tables, *(f"lookup-{n}" for n in LOOKUP_NS)]}
    for s in heldout:
        ids, labels = s.ids.tolist(), s.labels.tolist()
        indexes = {n: NgramIndex(n) for n in LOOKUP_NS}
        for a in anchors_of(s, block).tolist():
            guesses = {name: t.predict(ids, a) for name, t in tables.items()}
            for n, index in indexes.items():
                j = index.find(ids[: a + 1])
                guesses[f"lookup-{n}"] = None if j is None else ids[j + 1]
            for name, guess in guesses.items():
                rows[name].update(anchors=1, covered=guess is not None, right=guess == labels[a + 1])
    return {name: _rates(c) for name, c in rows.items()}


def _rates(c: Counter) -> dict:
    n = max(c["anchors"], 1)
    return {"anchors": c["anchors"], "coverage": c["covered"] / n, "accuracy": c["right"] / n,
            "precision": c["right"] / max(c["covered"], 1)}


class DraftSlots:
    """The draft's argmax at every slot of blocks at the given anchors (fully masked, as the engine drafts)."""

    def __init__(self, draft, embed: torch.Tensor, lm_head: torch.Tensor, vocab: torch.Tensor | None):
        self.draft, self.embed = draft, embed  # embed [V, H]
        self.vocab = vocab if vocab is not None else torch.arange(lm_head.shape[0])
        self.head = lm_head[self.vocab].contiguous()  # [Vd, H]
        self.block, self.mask_id = draft.config.block_size, draft.config.mask_token_id
        self.hints = AnchorHints(draft.config.hint_ngram) if draft.config.hint_ngram else None

    @torch.no_grad()
    def predict(self, seq: Sequence, anchors: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """[n, b-1] predicted target ids for slots 1..b-1."""
        b, T = self.block, len(seq)
        ctx = self.draft.context_kv(seq.feats.float()[None], torch.arange(T))
        out = []
        for part in anchors.split(chunk):
            pos = part[:, None] + torch.arange(b)[None, :]  # [n, b]
            inputs = seq.ids[pos].clone()
            inputs[:, 1:] = self.mask_id
            x = block_embeds(self.draft, self.embed, self.hints, seq, part, inputs)  # [n*b, H]
            hidden = self.draft(x[None], pos.flatten(), ctx,
                                block_attention_mask(part, T, b)[None, None])[0].view(len(part), b, -1)
            out.append(self.vocab[(hidden[:, 1:] @ self.head.T).argmax(-1)])
        return torch.cat(out) if out else torch.empty(0, b - 1, dtype=torch.long)


def slot_accuracy(slots: DraftSlots, heldout: list[Sequence]) -> dict:
    """Per slot k: unconditional accuracy where slot k's label is on the target's path, and accepted-prefix rate."""
    b = slots.block
    hit, valid, prefix, blocks = torch.zeros(b - 1), torch.zeros(b - 1), torch.zeros(b - 1), 0
    for s in heldout:
        anchors = anchors_of(s, b)
        if not len(anchors):
            continue
        pos = anchors[:, None] + torch.arange(b)[None, :]
        right = slots.predict(s, anchors) == s.labels[pos][:, 1:]  # [n, b-1]
        # A teacher-forced label past a recorded token that is not the target's answers another context: not counted.
        ok = on_policy_prefix(s.ids[pos] == s.labels[pos])[:, 1:]
        hit += (right & ok).sum(0)
        valid += ok.sum(0)
        prefix += (right & ok).long().cumprod(-1).sum(0)
        blocks += len(anchors)
    return {"blocks": blocks, "slot_acc": (hit / valid.clamp(min=1)).tolist(), "slot_n": valid.long().tolist(),
            "prefix_acc": (prefix / max(blocks, 1)).tolist(), "tau_tf": 1.0 + float((prefix / max(blocks, 1)).sum())}


def run_diagnose(cfg: DiagnoseConfig) -> dict:
    from dflash.models.draft import load_draft
    from dflash.loading.load import load_target_model
    from dflash.training.fit_config import read_data_meta

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    metas = read_data_meta(cfg.data)
    draft, vocab = load_draft(cfg.draft)
    corpus = Corpus(cfg.data, list(draft.config.target_layer_ids), cfg.holdout_shards)
    if not corpus.heldout or not corpus.train:
        raise ValidationError("--holdout-shards", f"leaves {len(corpus.train)} training and {len(corpus.heldout)} "
                                                  "held-out sequences in --data; both are needed")
    model, _ = load_target_model(metas[0]["target"])
    embed = model.get_input_embeddings().weight.detach().float().clone()
    lm_head = model.get_output_embeddings().weight.detach().float().clone()
    final_norm = model.model.norm.weight.detach().float().clone()
    del model
    t0 = time.perf_counter()
    slots = DraftSlots(draft, embed, lm_head, vocab)
    result = {"config": asdict(cfg), "train_sequences": len(corpus.train), "heldout_sequences": len(corpus.heldout),
              "train_response_tokens": corpus.n_tokens(), "block_size": slots.block,
              "baselines": baseline_rows(corpus.heldout, corpus.train, slots.block)}
    log.info("baselines measured (%.0f s)", time.perf_counter() - t0)
    result["draft"] = slot_accuracy(slots, corpus.heldout)
    log.info("the draft measured on %d held-out blocks (%.0f s)", result["draft"]["blocks"], time.perf_counter() - t0)
    result["probes"] = train_probe_pair(corpus, embed, slots.head, slots.vocab, final_norm, cfg, slots.block)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


def summary_lines(result: dict) -> list[str]:
    """The result in a few lines (stderr of the command, and TRAINING.md's table rows)."""
    d, p = result["draft"], result["probes"]
    lines = [f"{result['draft']['blocks']} held-out blocks of {result['block_size']}; "
             f"draft slot-1 accuracy {d['slot_acc'][0]:.3f}, tau (teacher-forced) {d['tau_tf']:.2f}"]
    lines += [f"{name}: right on {r['accuracy']:.3f} of anchors (covers {r['coverage']:.3f}, precision {r['precision']:.3f})"
              for name, r in result["baselines"].items()]
    lines.append(f"probe (i) anchor-blind MLP: {p['mlp']['heldout_acc']:.3f}; (ii) + lookup by the anchor: "
                 f"{p['lookup']['heldout_acc']:.3f}; gap {p['gap']:+.3f}")
    return lines
