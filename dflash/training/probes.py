"""The probe pair of `train diagnose`: how well slot 1 (the target's token at a+1) can be predicted from stored data.

(i) `lookup=False`: an MLP on [the target's fused features at a−1; the embedding of the anchor token]. This is what a
    masked slot of a one-layer DFlash draft can compute: its attention query comes from the MASK embedding and its
    position, so where it looks in the context cannot depend on the anchor.
(ii) `lookup=True`: the same, plus one attention read over the context's features (positions < a) whose query is
    computed from the anchor's embedding — what a slot that knows the anchor can look up (copying is one such lookup).
Same anchors, steps, batch and seed. (ii) − (i) is what the anchor-blind query costs; (ii) bounds what a deeper draft
can hope for with these features.
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from dflash.training.corpus import Corpus, Sequence
from dflash.training.objective import cosine_lr, sample_anchors

ANCHORS_PER_SEQ = 64
LR = 1e-3
LOG_EVERY = 100  # steps between progress lines (the probes take minutes on a CPU)
log = logging.getLogger("dflash.train")


def anchors_of(seq: Sequence, block: int) -> torch.Tensor:
    """Every response anchor with a full block of labels after it, [n] sorted (all of them: n is unbounded)."""
    return sample_anchors(max(seq.prompt_len, 1), len(seq), block, 1 << 30, torch.Generator())


class SlotProbe(nn.Module):
    def __init__(self, feat_dim: int, hidden: int, heads: int, lookup: bool, final_norm: torch.Tensor):
        super().__init__()
        self.in_norm = nn.RMSNorm(feat_dim + hidden)
        self.mlp = nn.Sequential(nn.Linear(feat_dim + hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))
        self.lookup, self.heads = lookup, heads
        if lookup:
            self.kv_norm, self.q_norm = nn.RMSNorm(feat_dim), nn.RMSNorm(hidden)
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(feat_dim, hidden), nn.Linear(feat_dim, hidden)
            self.o = nn.Linear(hidden, hidden)
        self.out_norm = nn.RMSNorm(hidden)
        with torch.no_grad():  # the target's final-norm gain: the shared head's expected input scale
            self.out_norm.weight.copy_(final_norm)

    def forward(self, feats: torch.Tensor, anchor_emb: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """feats [T, F] of one sequence, anchor_emb [n, H], anchors [n] (each >= 1) → hidden [n, H]."""
        h = self.mlp(self.in_norm(torch.cat([feats[anchors - 1], anchor_emb], -1)))
        if self.lookup:
            n, T, d = len(anchors), feats.shape[0], h.shape[-1] // self.heads
            kv = self.kv_norm(feats)
            k = self.k(kv).view(T, self.heads, d).transpose(0, 1)  # [nh, T, d]
            v = self.v(kv).view(T, self.heads, d).transpose(0, 1)
            q = self.q(self.q_norm(anchor_emb)).view(n, self.heads, d).transpose(0, 1)  # [nh, n, d]
            seen = torch.arange(T)[None, :] < anchors[:, None]  # [n, T]: the context strictly before the anchor
            read = F.scaled_dot_product_attention(q, k, v, attn_mask=seen[None])  # [nh, n, d]
            h = h + self.o(read.transpose(0, 1).reshape(n, -1))
        return self.out_norm(h)


def _batch(seq: Sequence, anchors: torch.Tensor, embed: torch.Tensor, remap: torch.Tensor):
    feats = seq.feats.float()
    return feats, embed[seq.ids[anchors]], remap[seq.labels[anchors + 1]]  # labels [n]: -1 outside the vocabulary


def train_probe(corpus: Corpus, embed: torch.Tensor, head: torch.Tensor, remap: torch.Tensor, final_norm: torch.Tensor,
                lookup: bool, steps: int, seqs: int, seed: int) -> tuple[SlotProbe, list[float]]:
    """One probe trained for `steps` steps of `seqs` sequences × ANCHORS_PER_SEQ anchors; returns it and its losses."""
    torch.manual_seed(seed)
    feat_dim, hidden = corpus.train[0].feats.shape[-1], embed.shape[-1]
    probe = SlotProbe(feat_dim, hidden, max(1, hidden // 64), lookup, final_norm)
    opt = torch.optim.AdamW(probe.parameters(), lr=LR, weight_decay=0.01)
    gen, losses, t0 = torch.Generator().manual_seed(seed), [], time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, steps, LR)
        opt.zero_grad(set_to_none=True)
        total, n = 0.0, 0
        for i in torch.randint(0, len(corpus.train), (seqs,), generator=gen).tolist():
            s = corpus.train[i]
            anchors = sample_anchors(max(s.prompt_len, 1), len(s), 2, ANCHORS_PER_SEQ, gen)
            if not len(anchors):
                continue
            feats, emb, labels = _batch(s, anchors, embed, remap)
            ok = labels >= 0
            if ok.any():
                loss = F.cross_entropy(probe(feats, emb, anchors)[ok] @ head.T, labels[ok])
                (loss / seqs).backward()
                total, n = total + float(loss.detach()), n + 1
        opt.step()
        losses.append(total / max(n, 1))
        if (step + 1) % LOG_EVERY == 0:
            log.info("probe %s: step %d/%d loss %.3f (%.2f s/step)", "lookup" if lookup else "mlp", step + 1, steps,
                     losses[-1], (time.perf_counter() - t0) / (step + 1))
    return probe.eval(), losses


@torch.no_grad()
def heldout_accuracy(probe: SlotProbe, seqs: list[Sequence], embed: torch.Tensor, head: torch.Tensor,
                     vocab: torch.Tensor, block: int) -> float:
    """Slot-1 accuracy on every held-out anchor with a full block after it (the anchors the draft is measured on)."""
    right = total = 0
    for s in seqs:
        anchors = anchors_of(s, block)
        if len(anchors):
            pred = vocab[(probe(s.feats.float(), embed[s.ids[anchors]], anchors) @ head.T).argmax(-1)]
            right += int((pred == s.labels[anchors + 1]).sum())
            total += len(anchors)
    return right / max(total, 1)


def train_probe_pair(corpus: Corpus, embed: torch.Tensor, head: torch.Tensor, vocab: torch.Tensor,
                     final_norm: torch.Tensor, cfg, block: int) -> dict:
    """Both probes (`cfg`: probe_steps, probe_seqs, seed) and their slot-1 accuracy on the held-out anchors of blocks
    of `block`. head [Vd, H] is the draft's (the target's LM head rows of `vocab`): the probes answer in its vocabulary."""
    remap = torch.full((embed.shape[0],), -1, dtype=torch.long)
    remap[vocab] = torch.arange(len(vocab))
    out = {}
    for name, lookup in (("mlp", False), ("lookup", True)):
        probe, losses = train_probe(corpus, embed, head, remap, final_norm, lookup, cfg.probe_steps, cfg.probe_seqs, cfg.seed)
        tail = losses[-max(1, len(losses) // 10):]
        out[name] = {"heldout_acc": heldout_accuracy(probe, corpus.heldout, embed, head, vocab, block),
                     "final_train_loss": sum(tail) / len(tail), "params": sum(p.numel() for p in probe.parameters()),
                     "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 50)]],
                     "ln_vocab": math.log(len(vocab))}
    out["gap"] = out["lookup"]["heldout_acc"] - out["mlp"]["heldout_acc"]
    out.update(steps=cfg.probe_steps, seqs_per_step=cfg.probe_seqs, anchors_per_seq=ANCHORS_PER_SEQ)
    return out
