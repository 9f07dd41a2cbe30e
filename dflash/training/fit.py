"""Stage `fit`: train a DFlash draft on the regenerated data (nanoGPT-style readable loop).

Per step: a few sequences; in each, random anchors inside the response, blocks [anchor, MASK × (b-1)] packed
with a block-diagonal mask that shows each block the target features strictly before its anchor; loss =
position-weighted cross-entropy on masked positions (+ optional KL to the target's distribution). Embedding and
LM head are the target's, frozen. Checkpoints: the draft in DFlash format (bf16, for serving) plus a float32
trainer state (weights + AdamW moments + step) in safetensors, so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dflash.models.draft import DFlashDraftModel, DraftConfig, load_draft, save_draft
from dflash.errors import ModelLoadError, ValidationError
from dflash.decode.lookup import NgramIndex
from dflash.training.corpus import Corpus, frequent_vocab
from dflash.training.fit_checks import STATE_NAME, check_against_data, check_resume, is_resume, stored_vocab
from dflash.training.data_config import check_run_out
from dflash.training.fit_config import FitConfig, corpus_fingerprint, read_data_meta
from dflash.training.interrupt import deferred_interrupt
from dflash.training.objective import (AnchorHints, block_attention_mask, block_embeds, cosine_lr, default_gamma,
                                       on_policy_prefix, partial_mask, position_weights, sample_anchors, weighted_loss)

log = logging.getLogger("dflash.train")


def widen_fc(weight: torch.Tensor, old_ids: list[int], new_ids: list[int]) -> torch.Tensor:
    """`fc` weight [H, len(old_ids)·H] placed into [H, len(new_ids)·H]: each old layer's columns at that layer's new
    slot, the added layers' columns 0 (so the fused context is unchanged until training moves them)."""
    h = weight.shape[0]
    out = weight.new_zeros(h, len(new_ids) * h)
    for i, j in enumerate(old_ids):
        k = new_ids.index(j)
        out[:, k * h:(k + 1) * h] = weight[:, i * h:(i + 1) * h]
    return out


def is_snapshot_step(step: int, base: int) -> bool:
    """True at base, 2·base, 4·base, ... (log-spaced)."""
    if base <= 0 or step < base or step % base:
        return False
    k = step // base
    return k & (k - 1) == 0


class Trainer:
    def __init__(self, cfg: FitConfig):
        from dflash.loading.registry import SMOLLM2_GGUF
        from dflash.loading.load import load_target_model
        from dflash.models.target import Target

        metas = read_data_meta(cfg.data)
        check_run_out(cfg.out)
        layer_ids = check_against_data(cfg, metas)  # bad options fail here, before the target loads
        check_resume(cfg)
        self.cfg, self.resuming = cfg, is_resume(cfg)
        self.fingerprint = corpus_fingerprint(cfg.data)  # the corpus read now: a resume checks it is the same
        self.corpus = self.read_corpus(layer_ids)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        model, tokenizer = load_target_model(metas[0].get("target", SMOLLM2_GGUF))
        tc = model.config
        # Frozen, shared: the target's embedding and LM head. [V, H] each.
        self.embed = model.get_input_embeddings().weight.detach().float().clone()
        self.lm_head = model.get_output_embeddings().weight.detach().float().clone()
        stops = sorted(Target(model, tokenizer).stop_ids())
        final_norm = model.model.norm.weight.detach().float().clone()  # [H]
        del model
        self.dcfg = DraftConfig.for_target(
            tc, self.embed.shape[0], layers=cfg.layers, block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
            intermediate_size=cfg.intermediate_size or tc.intermediate_size, target_layer_ids=layer_ids,
            rms_norm_eps=tc.rms_norm_eps, rope_theta=getattr(tc, "rope_theta", 10000.0),
            max_position_embeddings=tc.max_position_embeddings, hint_ngram=cfg.hint_ngram)
        log.info("corpus: %d training sequences, %d response tokens; %d held out", len(self.corpus.train),
                 self.corpus.n_tokens(), len(self.corpus.heldout))
        self.draft, vocab = self.init_draft(final_norm)
        vocab = stored_vocab(Path(cfg.out)) if self.resuming else vocab  # the run's own, whatever changed since
        if vocab is not None:
            self.vocab = vocab
        elif cfg.draft_vocab:
            self.vocab = frequent_vocab(self.corpus.token_counts(self.embed.shape[0]), cfg.draft_vocab, stops)
        else:
            self.vocab = torch.arange(self.embed.shape[0])
        self.head = self.lm_head[self.vocab].contiguous()  # [Vd, H]
        self.remap = torch.full((self.embed.shape[0],), -1, dtype=torch.long)
        self.remap[self.vocab] = torch.arange(len(self.vocab))
        self.weights = position_weights(cfg.block_size, cfg.gamma or default_gamma(cfg.block_size))
        self.hints = AnchorHints(cfg.hint_ngram) if cfg.hint_ngram else None
        if cfg.train_only:  # the hint weights alone learn; the rest stays as --init-from gave it (no gradients kept)
            for name, p in self.draft.named_parameters():
                p.requires_grad_(name.startswith("hint_"))
        trained = [p for p in self.draft.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        self.step = 0
        self.log_path = Path(cfg.out) / "train_log.jsonl"
        self._copyable: dict[int, torch.Tensor] = {}  # id(sequence) → `copyable`

    def init_draft(self, final_norm: torch.Tensor) -> tuple[DFlashDraftModel, torch.Tensor | None]:
        """A fresh draft (or the `init_from` draft's weights and vocabulary). Fresh: N(0, 0.02) weights; with
        residual_init "zero" the projections that write into the residual stream start at 0, so at step 0 the
        block's hidden state is the final-normed MASK embedding. Either way the first loss is far above ln V:
        through the tied head a normed embedding row scores its own neighbours with logits of std ~22 (measured
        for SmolLM2's MASK id 16), a transient that the first few steps remove."""
        torch.manual_seed(self.cfg.seed)
        draft = DFlashDraftModel(self.dcfg)
        for name, mod in draft.named_modules():
            if isinstance(mod, torch.nn.Linear):
                zero = self.cfg.residual_init == "zero" and name.endswith(("o_proj", "down_proj"))
                torch.nn.init.zeros_(mod.weight) if zero else torch.nn.init.normal_(mod.weight, std=0.02)
        with torch.no_grad():  # the target's final-norm gain gives the shared LM head its expected input scale
            draft.norm.weight.copy_(final_norm)
            if self.dcfg.hint_ngram:  # hints start unread: a warm start computes its source's function at step 0
                draft.hint_proj.weight.zero_()
                draft.hint_len.weight.zero_()
        # A resume loads every weight from its trainer state: the --init-from draft is not read again.
        return self.warm_start(draft) if self.cfg.init_from and not self.resuming else (draft, None)

    def read_corpus(self, layer_ids: list[int]) -> Corpus:
        """The training and held-out sequences (a fixed-seed fraction with --data-fraction), refused when no
        response is long enough for one block (every step would train nothing)."""
        cfg = self.cfg
        corpus = Corpus(cfg.data, layer_ids, cfg.holdout_shards)
        if cfg.data_fraction < 1.0:  # a fixed-seed subset, so the ablation is reproducible
            keep = torch.randperm(len(corpus.train), generator=torch.Generator().manual_seed(0))
            keep = keep[: max(1, int(len(keep) * cfg.data_fraction))].sort().values.tolist()
            corpus.train = [corpus.train[i] for i in keep]
        longest = max((len(s) - s.prompt_len for s in corpus.train), default=0)
        if longest < cfg.block_size:  # sample_anchors: a block needs block_size response tokens from its anchor on
            raise ValidationError("--block-size", f"no response in --data is long enough for a block of {cfg.block_size} "
                                                  f"(the longest training response has {longest} tokens); use a smaller "
                                                  "--block-size or longer responses")
        return corpus

    def warm_start(self, draft: DFlashDraftModel) -> tuple[DFlashDraftModel, torch.Tensor | None]:
        """Load the `init_from` draft into `draft`. A deeper run keeps the source's layers and appends new ones
        whose residual writes (o_proj, down_proj) start at 0, and a run that fuses more target layers gives the
        new layers' `fc` columns 0, so at step 0 it computes exactly the source draft's function: depth and
        features grow without losing what was learned."""
        try:
            src, vocab = load_draft(self.cfg.init_from)
        except ModelLoadError as exc:  # its weights unreadable (its config was checked before the target loaded)
            raise ValidationError("--init-from", f"{self.cfg.init_from}: {str(exc).removeprefix('draft: ')}") from None
        shape = lambda c: c.to_hf_dict() | {"block_size": 0, "num_hidden_layers": 0, "dflash_config": 0}  # noqa: E731
        kept, old_ids = src.config.num_hidden_layers, src.config.target_layer_ids
        if (shape(src.config) != shape(self.dcfg) or kept > self.dcfg.num_hidden_layers
                or src.config.mask_token_id != self.dcfg.mask_token_id or not set(old_ids) <= set(self.dcfg.target_layer_ids)):
            raise ValidationError("--init-from", f"{self.cfg.init_from} has another architecture than this run")
        state = src.state_dict()
        state["fc.weight"] = widen_fc(state["fc.weight"], old_ids, self.dcfg.target_layer_ids)
        missing, unexpected = draft.load_state_dict(state, strict=False)
        if unexpected:  # a hinted source into a run without hints
            raise ValidationError("--init-from", f"{self.cfg.init_from} is a hinted draft: give the run --hint-ngram "
                                                 f"{src.config.hint_ngram}")
        new = lambda k: k.startswith("hint_") or k.startswith("layers.") and int(k.split(".")[1]) >= kept  # noqa: E731
        assert all(map(new, missing)), missing
        for layer in draft.layers[kept:]:
            torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
            torch.nn.init.zeros_(layer.mlp.down_proj.weight)
        return draft, vocab if self.cfg.draft_vocab else None

    # -- one batch --------------------------------------------------------------------------------------
    def seq_loss(self, seq: dict, gen: torch.Generator, partial_prob: float) -> tuple[torch.Tensor, dict] | None:
        b = self.cfg.block_size
        ids, T = seq["ids"], seq["ids"].shape[0]
        anchors = sample_anchors(seq["prompt_len"], T, b, self.cfg.anchors_per_seq, gen)  # [nb]
        if anchors.numel() == 0:
            return None
        nb = anchors.shape[0]
        offs = torch.arange(b)
        pos = (anchors[:, None] + offs[None, :])  # [nb, b] absolute positions
        truth = seq["labels"][pos]  # [nb, b] what the target emits at each block position
        truth[:, 0] = ids[anchors]  # the anchor itself is the real context token
        masked = partial_mask(nb, b, partial_prob, gen)  # [nb, b]
        inputs = torch.where(masked, torch.full_like(truth, self.cfg.mask_token_id), truth)
        feats = seq["feats"].float()[None]  # [1, T, k*H]
        ctx_kv = self.draft.context_kv(feats, torch.arange(T))
        mask = block_attention_mask(anchors, T, b)[None, None]  # [1, 1, nb*b, T + nb*b]
        x = block_embeds(self.draft, self.embed, self.hints, seq, anchors, inputs)  # [nb*b, H]
        hidden = self.draft(x[None], pos.flatten(), ctx_kv, mask)[0]  # [nb*b, H]
        sel = masked.flatten()
        labels = self.remap[truth.flatten()[sel]]
        valid = labels >= 0  # [N] in the draft vocabulary
        if self.cfg.onpolicy_blocks:
            valid &= on_policy_prefix(ids[pos] == seq["labels"][pos]).flatten()[sel]
        w = self.weights[(offs[None, :].expand(nb, b).flatten()[sel]) - 1]
        if self.cfg.copy_weight != 1.0:  # blocks the copy-first chain copies instead of drafting
            per_block = torch.where(self.copyable(seq)[anchors], self.cfg.copy_weight, 1.0)  # [nb]
            w = w * per_block[:, None].expand(nb, b).flatten()[sel]
        keep = sel.nonzero().squeeze(-1)[valid & (w > 0)]  # [N'] rows of the head's work: the supervised ones only
        logits = hidden[keep] @ self.head.T  # [N', Vd]
        teacher = None
        if self.cfg.kl_weight > 0:  # the target's hidden at p-1 predicts the token at p
            teacher = seq["final"][pos.flatten()[keep] - 1].float() @ self.head.T
        kept = valid & (w > 0)
        loss, metrics = weighted_loss(logits, labels[kept], w[kept], torch.ones_like(labels[kept], dtype=torch.bool),
                                      teacher, self.cfg.kl_weight)
        return loss, metrics | {"positions": int(kept.sum())}

    def copyable(self, seq) -> torch.Tensor:
        """[T] bool: position a ends a copy_ngram seen earlier in the sequence, so the copy-first chain (Request.
        lookup_ngram = copy_ngram) copies the block anchored there. Computed once per sequence."""
        key = id(seq)
        if key not in self._copyable:
            ids, index = seq["ids"].tolist(), NgramIndex(self.cfg.copy_ngram)
            self._copyable[key] = torch.tensor([index.find(ids[: a + 1]) is not None for a in range(len(ids))])
        return self._copyable[key]

    def batch_generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)  # same batches after a resume

    def train_step(self) -> dict:
        cfg = self.cfg
        gen = self.batch_generator(self.step)
        picks = torch.randint(0, len(self.corpus.train), (cfg.seqs_per_step,), generator=gen).tolist()
        lr = cosine_lr(self.step, cfg.steps, cfg.lr)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.draft.train()
        self.opt.zero_grad(set_to_none=True)
        total, metrics, n = 0.0, {"ce": 0.0, "acc": 0.0, "kl": 0.0}, 0
        for i in picks:
            out = self.seq_loss(self.corpus.train[i], gen, cfg.partial_prob)
            if out is None:
                continue
            loss, m = out
            (loss / cfg.seqs_per_step).backward()
            total += float(loss.detach())
            n += 1
            for k in m:
                metrics[k] = metrics.get(k, 0.0) + m[k]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.clip))
        self.opt.step()
        self.step += 1
        positions = int(metrics.pop("positions", 0))  # supervised positions this step: the x axis of the τ curve
        return {"step": self.step, "loss": total / max(n, 1), "lr": lr, "grad_norm": grad_norm, "positions": positions,
                **{k: v / max(n, 1) for k, v in metrics.items()}}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Teacher-forced accuracy per block slot on every held-out anchor (`diagnose.slot_accuracy`): unconditional
        (`slot_acc`) and as an accepted prefix (`prefix_acc`, whose sum + 1 is `tau_tf`)."""
        from dflash.training.diagnose import DraftSlots, slot_accuracy

        self.draft.eval()
        slots = DraftSlots(self.draft, self.embed, self.lm_head, self.vocab)
        return slot_accuracy(slots, self.corpus.heldout or self.corpus.train[:64])

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self) -> None:
        from safetensors.torch import save_file

        out = Path(self.cfg.out)
        save_draft(self.draft, out, vocab_ids=self.vocab if self.cfg.draft_vocab else None,
                   extra_config={"dflash_training": {**asdict(self.cfg), "step": self.step}})
        state = {f"model.{k}": v.detach().float().contiguous() for k, v in self.draft.state_dict().items()}
        for i, p in enumerate(self.draft.parameters()):
            st = self.opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq"):
                if k in st:
                    state[f"opt.{i}.{k}"] = st[k].contiguous()
        # The state is the checkpoint's commit point, written last and atomically: a kill mid-write leaves the
        # previous state whole, and a resume from it makes the draft files again.
        tmp = out / (STATE_NAME + ".tmp")
        state["vocab"] = self.vocab.contiguous()  # a resume keeps it (fit_checks.stored_vocab)
        save_file(state, str(tmp), metadata={"step": str(self.step), "config": json.dumps(asdict(self.cfg)),
                                             "corpus": json.dumps(self.fingerprint)})
        tmp.replace(out / STATE_NAME)

    def trim_log(self) -> None:
        """Drop the log rows of steps after the checkpoint (a run killed between checkpoints logged them; the
        resumed run logs them again), so the log holds each step once."""
        if not self.log_path.is_file():
            return
        rows = self.log_path.read_text().splitlines(keepends=True)
        keep = [r for r in rows if r.endswith("\n") and json.loads(r)["step"] <= self.step]  # no half-written row
        if len(keep) != len(rows):
            tmp = self.log_path.with_suffix(".tmp")
            tmp.write_text("".join(keep))
            tmp.replace(self.log_path)

    def log_start(self) -> None:
        """One line per start or resume in runs.jsonl: the machine (CPU flags), the config and the corpus size."""
        from dflash.bench.machine import machine_info

        row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": self.step, "config": asdict(self.cfg),
               "corpus_tokens": self.corpus.n_tokens(), "corpus_sequences": len(self.corpus.train),
               "draft_vocab": len(self.vocab), "machine": machine_info()}
        with (Path(self.cfg.out) / "runs.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def save_snapshot(self) -> None:
        """The draft alone (serving format) at a log-spaced step, for the τ-vs-data curve."""
        save_draft(self.draft, Path(self.cfg.out) / "snapshots" / f"step_{self.step:06d}",
                   vocab_ids=self.vocab if self.cfg.draft_vocab else None,
                   extra_config={"dflash_training": {**asdict(self.cfg), "step": self.step}})

    def load(self) -> bool:
        from safetensors import safe_open
        from safetensors.torch import load_file

        path = Path(self.cfg.out) / STATE_NAME
        if not path.is_file():
            return False
        state = load_file(str(path))
        with safe_open(str(path), "pt") as f:
            self.step = int(f.metadata()["step"])
        self.draft.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
        for i, p in enumerate(self.draft.parameters()):
            if f"opt.{i}.exp_avg" in state:
                self.opt.state[p] = {"step": torch.tensor(float(self.step)), "exp_avg": state[f"opt.{i}.exp_avg"],
                                     "exp_avg_sq": state[f"opt.{i}.exp_avg_sq"]}
        return True

    def fit(self, progress: bool = True) -> None:
        from tqdm import tqdm

        Path(self.cfg.out).mkdir(parents=True, exist_ok=True)
        if self.load():
            log.info("resumed at step %d", self.step)
        self.trim_log()
        self.log_start()
        t0, start = time.time(), self.step
        # `with` closes the bar on Ctrl-C too, so the CLI's "interrupted" gets a line of its own; Ctrl-C stops at the
        # end of a step (its log row written), never inside the reading of a shard.
        with deferred_interrupt() as ctrl_c, self.log_path.open("a") as logf, \
                tqdm(total=self.cfg.steps, initial=self.step, disable=not progress, desc="fit") as bar:
            while self.step < (self.cfg.stop_at or self.cfg.steps):
                if ctrl_c.is_set():
                    self.stop_here(start)
                ts = time.time()
                m = self.train_step()
                # Timings (not compared by a resume): the run's mean step, and this step's supervised positions per second.
                m["s_per_step"] = (time.time() - t0) / (self.step - start)
                m["positions_per_s"] = round(m["positions"] / max(time.time() - ts, 1e-9), 1)
                bar.update(1)
                bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['acc']:.3f}", spb=f"{m['s_per_step']:.2f}")
                if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                    m.update(self.evaluate())
                    log.info("step %d loss %.3f acc %.3f tau_tf %.3f", self.step, m["loss"], m["acc"], m["tau_tf"])
                logf.write(json.dumps(m) + "\n")
                logf.flush()
                # The snapshot before the checkpoint: a run killed between or while writing them resumes from the
                # previous checkpoint and writes this step's snapshot again (one resumed from this step never would).
                last = self.cfg.snapshot_base and self.step in (self.cfg.steps, self.cfg.stop_at)
                if last or is_snapshot_step(self.step, self.cfg.snapshot_base):
                    self.save_snapshot()
                if self.step % self.cfg.ckpt_every == 0 or self.step in (self.cfg.steps, self.cfg.stop_at):
                    self.save()
        out = self.cfg.out
        log.info("done at step %d: the draft is in %s; measure it with `python -m dflash train eval --draft %s`, watch it "
                 "with `python app.py --draft %s`", self.step, out, out, out)

    def stop_here(self, start: int) -> None:
        """Ctrl-C at a step boundary: checkpoint the steps since the last one, so the same command resumes from here
        exactly (a second Ctrl-C while it is written leaves the previous checkpoint: every file is renamed into place)."""
        if self.step > start and self.step % self.cfg.ckpt_every:  # else this step's checkpoint is written
            self.save()
        log.info("stopped at step %d; checkpoint in %s: run the same command to resume", self.step, self.cfg.out)
        raise KeyboardInterrupt
