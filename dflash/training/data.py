"""Stage `data`: regenerate responses with the target (greedy + some sampled), batched, resumable.

Each shard `shard_NNNNN.safetensors` holds, for every sequence (chat-templated prompt + the target's response):
  input_ids [N] int64 (sequences concatenated), offsets [S+1], prompt_lens [S],
  features [N, k*H] bf16 — outputs of target layers `layer_ids` (the draft's context),
  final_hidden [N, H] bf16 — the target's last normed hidden state (teacher logits = lm_head(final_hidden)).
Features are captured by hooks during generation itself, so they cost no extra target pass. Rerunning the command
resumes: a shard on disk that holds what this run plans for its slot is skipped (data_config.check_resume first
refuses a directory made with other settings).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from dflash.errors import ValidationError
from dflash.training.data_config import (WINDOW_BATCHES, DataConfig, TeacherForcedConfig, check_layers_exist, check_resume,
                                         generation_settings, shard_problem, stored_rows, write_meta)
from dflash.training.interrupt import shielded

log = logging.getLogger("dflash.train")


def chat_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """A user prompt, or a whole chat history (messages), with the chat template and the assistant's header: the
    engine's own prompt rendering, so training sees exactly the prompts generation will."""
    from dflash.models.target import chat_prompt_ids

    return chat_prompt_ids(tokenizer, prompt)


class Capture:
    """Forward hooks on the chosen decoder layers and the final norm."""

    def __init__(self, model, layer_ids: list[int]):
        from dflash.models.target import feature_module

        self.out: dict[str, torch.Tensor] = {}
        self.handles = [feature_module(model, j).register_forward_hook(self._hook(f"l{j}")) for j in layer_ids]
        self.handles.append(model.model.norm.register_forward_hook(self._hook("final")))
        self.layer_ids = layer_ids

    def _hook(self, key: str):
        def hook(_m, _i, output):
            self.out[key] = output[0] if isinstance(output, tuple) else output

        return hook

    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([self.out[f"l{j}"] for j in self.layer_ids], -1), self.out["final"]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int], pad_id: int,
                   capture: Capture, temperature: float, generator: torch.Generator | None):
    """Left-padded batched generation. Returns per row (token ids, features [T, kH], final hidden [T, H]).

    Not the engine's loop (`Engine.stream`), on purpose: training data needs many prompts decoded side by side with
    their hidden states captured, and no verification, events or per-position seeded noise (`torch.multinomial`
    sampling is enough for data)."""
    from transformers import DynamicCache

    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    cache = DynamicCache(config=model.config)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    feats, finals = [], []
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
    f, h = capture.features()
    feats.append(f), finals.append(h)
    responses: list[list[int]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    next_pos = pos[:, -1:] + 1
    for _step in range(max_new_tokens):
        logits = out.logits[:, -1].float()  # [b, V]
        if temperature > 0:
            tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        else:
            tok = logits.argmax(-1)
        for i in range(b):
            if not done[i]:
                responses[i].append(int(tok[i]))
                if int(tok[i]) in stop_ids:
                    done[i] = True
        mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], 1)
        # Feed every row (finished rows too: their extra outputs are discarded) so the last token's features exist.
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        f, h = capture.features()
        feats.append(f), finals.append(h)
        next_pos = next_pos + 1
        if bool(done.all()):
            break
    feats_t, finals_t = torch.cat(feats, 1), torch.cat(finals, 1)  # [b, width + steps, ...]
    rows = []
    for i, p in enumerate(prompts):
        n = len(p) + len(responses[i])
        lo = width - len(p)
        rows.append((p + responses[i], feats_t[i, lo:lo + n].to(torch.bfloat16), finals_t[i, lo:lo + n].to(torch.bfloat16)))
    return rows


def run_data(cfg: DataConfig) -> None:
    """ShareGPT training prompts (chat template applied) → shards in `cfg.out`."""
    from dflash.loading.datasets import sharegpt_prompts

    check_resume(cfg.out, cfg.settings())  # before the model loads: a refusal takes a second
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tokenizer = load_target(cfg.target)
    check_layers_exist(cfg.layers, model.config.num_hidden_layers)
    prompts = []
    for text in sharegpt_prompts("train"):
        ids = chat_ids(tokenizer, text)
        if len(ids) <= cfg.max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) >= cfg.prompts:
            break
    if not prompts:  # else an --out with only meta.json, which `train fit` cannot train on
        raise ValidationError("--max-prompt-tokens", f"no ShareGPT prompt has at most {cfg.max_prompt_tokens} tokens")
    # Similar lengths in one batch (left padding to the longest prompt would otherwise dominate prefill cost), sorted
    # only within windows so that a larger --prompts keeps what the shards of the complete windows hold.
    prompts = sort_in_windows(prompts, cfg.batch_size * WINDOW_BATCHES, len)
    write_shards(model, tokenizer, cfg.target, prompts, cfg.out, list(cfg.layers), cfg.batch_size, cfg.max_new_tokens,
                 cfg.sampled_every, cfg.temperature, cfg.seed, selection=cfg.selection())


def write_shards(model, tokenizer, target: str, prompts: list[list[int]], out_dir: str, layer_ids: list[int],
                 batch_size: int, max_new_tokens: int, sampled_every: int, temperature: float, seed: int,
                 selection: dict | None = None) -> None:
    """Generate responses for `prompts` (token ids) in batches; one shard per batch. A shard already in `out_dir` is
    kept when it holds this batch's prompts (made with the same settings: `check_resume`), else made again.
    `selection`: the meta.json keys of how `prompts` were chosen and ordered."""
    from safetensors.torch import save_file

    from dflash.models.target import Target

    out = Path(out_dir)
    settings = generation_settings(target, layer_ids, batch_size, max_new_tokens, sampled_every, temperature, seed)
    settings |= selection or {}
    check_resume(out, settings)
    out.mkdir(parents=True, exist_ok=True)
    write_meta(out, settings, model.config)
    model.eval()
    stops = Target(model, tokenizer).stop_ids()
    pad = (tokenizer.pad_token_id if tokenizer is not None else None) or 0
    capture = Capture(model, layer_ids)
    gen = torch.Generator().manual_seed(seed)
    n_shards = (len(prompts) + batch_size - 1) // batch_size
    drop_stale(out, [[(p, len(p)) for p in prompts[s:s + batch_size]] for s in range(0, len(prompts), batch_size)], True)
    t0, done_tokens = time.time(), 0
    for s in range(n_shards):
        path = shard_path(out, s)
        batch = prompts[s * batch_size:(s + 1) * batch_size]
        if path.exists():  # holds this slot's prompts (drop_stale)
            continue
        temp = temperature if sampled_every and s % sampled_every == sampled_every - 1 else 0.0
        gen.manual_seed(seed * 100_003 + s)
        rows = generate_batch(model, batch, max_new_tokens, stops, pad, capture, temp, gen)
        ids = [torch.tensor(r[0]) for r in rows]
        lens = torch.tensor([0] + [len(x) for x in ids])
        tensors = {"input_ids": torch.cat(ids), "offsets": lens.cumsum(0), "prompt_lens": torch.tensor([len(p) for p in batch]),
                   "features": torch.cat([r[1] for r in rows]), "final_hidden": torch.cat([r[2] for r in rows])}
        with shielded():  # a Ctrl-C here waits for the shard to be whole
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp), metadata={"temperature": str(temp)})
            tmp.replace(path)
        done_tokens += sum(len(r[0]) - len(p) for r, p in zip(rows, batch))
        log.info("shard %d/%d (T=%.1f): %d response tokens so far, %.1f tok/s", s + 1, n_shards, temp, done_tokens,
                 done_tokens / (time.time() - t0))
    capture.remove()


def shard_path(out: Path, s: int) -> Path:
    return out / f"shard_{s:05d}.safetensors"


def drop_stale(out: Path, plans: list[list[tuple[list[int], int]]], prompt_only: bool) -> None:
    """Delete every shard that does not hold what this run plans for its slot (`plans[s]`, see `keep_shard`) before
    any is made again: a run interrupted while it remakes them leaves missing shards, which a rerun makes, never
    old ones whose sequences a new shard also holds (trained on twice, or held out and trained on)."""
    for s, planned in enumerate(plans):
        path = shard_path(out, s)
        with shielded():  # a Ctrl-C inside safetensors' reading would surface as a ValueError, not an interrupt
            if path.exists() and not keep_shard(path, planned, prompt_only):
                path.unlink()


def keep_shard(path: Path, planned: list[tuple[list[int], int]], prompt_only: bool) -> bool:
    """True when the shard at `path` exists and holds the planned (sequence, prompt length) rows (`prompt_only`: the
    planned sequences are prompts, compared with the stored sequences' prompts). A count that grew changes what
    the last, incomplete sort window holds, so its shards are made again."""
    if not path.exists():
        return False
    if problem := shard_problem(path):  # a run killed mid-copy, a full disk: this slot is made again
        log.warning("%s is %s: it will be made again", path.name, problem)
        return False
    stored = stored_rows(path)
    if prompt_only:
        stored = [(ids[:n], n) for ids, n in stored]
    if stored == planned:
        return True
    log.info("%s holds other sequences than this run plans for it: it will be made again", path.name)
    return False


@torch.inference_mode()
def teacher_forced_batch(model, seqs: list[list[int]], pad_id: int, capture: Capture, chunk: int = 4096):
    """One forward over recorded conversations (right-padded). Returns per row (ids, features, final hidden,
    the target's own greedy prediction after each position [T]) — labels the target itself would emit."""
    b, width = len(seqs), max(len(x) for x in seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = 1
    model.model(input_ids=ids, attention_mask=mask)  # base model only: no [B, T, V] logits tensor
    feats, final = capture.features()
    head = model.get_output_embeddings().weight  # [V, H]
    flat = final.reshape(-1, final.shape[-1])
    pred = torch.cat([(flat[i:i + chunk] @ head.T).argmax(-1) for i in range(0, flat.shape[0], chunk)]).view(b, width)
    return [(x, feats[i, :len(x)].to(torch.bfloat16), final[i, :len(x)].to(torch.bfloat16), pred[i, :len(x)])
            for i, x in enumerate(seqs)]


def sort_in_windows(rows: list, window: int, key) -> list:
    """Sort by length inside consecutive windows of `window` rows: batches of similar lengths (little padding)
    while every prefix of the shards stays a sample of the whole corpus, so a run stopped early is not biased
    towards short sequences, and one resumed with a larger count keeps the shards of its complete windows (those
    of the last, incomplete window hold other rows then: `keep_shard` makes them again)."""
    return [r for i in range(0, len(rows), window) for r in sorted(rows[i:i + window], key=key)]


def run_teacher_forced(cfg: TeacherForcedConfig) -> None:
    """Cheap extra data: ShareGPT's recorded replies, one teacher-forced target pass each (no generation), with
    the target's own next-token predictions stored as labels (`target_pred`). Off-policy contexts, on-policy
    labels: one forward pass per sequence instead of one per token, so several times more tokens per CPU second
    than regeneration."""
    check_resume(cfg.out, cfg.settings())  # before the model loads: a refusal takes a second
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tokenizer = load_target(cfg.target)
    check_layers_exist(cfg.layers, model.config.num_hidden_layers)
    model.eval()
    rows = sort_in_windows(recorded_rows(tokenizer, cfg), cfg.batch_size * WINDOW_BATCHES, lambda pr: len(pr[0]) + len(pr[1]))
    if not rows:  # else an --out with only meta.json, which `train fit` cannot train on
        raise ValidationError("--min-prompt-tokens" if cfg.min_prompt_tokens else "--max-prompt-tokens",
                              f"no ShareGPT reply ({cfg.turns} turns) has a prompt of more than --min-prompt-tokens "
                              f"{cfg.min_prompt_tokens} and at most --max-prompt-tokens {cfg.max_prompt_tokens} tokens")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_meta(out, cfg.settings(), model.config)
    write_teacher_forced(model, tokenizer.pad_token_id or 0, rows, out, cfg)


def load_target(source: str):
    """The target model and tokenizer; one that cannot be loaded is named as the --target option."""
    from dflash.errors import ModelLoadError
    from dflash.loading.load import load_target_model

    try:
        return load_target_model(source)
    except ModelLoadError as exc:
        if not str(exc).startswith("target: "):
            raise
        raise ValidationError("--target", str(exc).removeprefix("target: ")) from None


def recorded_rows(tokenizer, cfg: TeacherForcedConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of the first `cfg.conversations` ShareGPT replies that fit, in file order."""
    from dflash.loading.datasets import sharegpt_dialogues, sharegpt_pairs

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    # "first": first turns deduplicated by text (the original set); "later"/"all": multi-turn histories.
    pairs = sharegpt_pairs("train") if cfg.turns == "first" else sharegpt_dialogues("train", cfg.turns)
    for prompt, reply in pairs:
        p = chat_ids(tokenizer, prompt)
        if not reply or not cfg.min_prompt_tokens < len(p) <= cfg.max_prompt_tokens:
            continue
        r = tokenizer(reply, add_special_tokens=False)["input_ids"][:cfg.max_response_tokens]
        rows.append((p, r + ([end] if len(r) < cfg.max_response_tokens and isinstance(end, int) else [])))
        if len(rows) >= cfg.conversations:
            break
    return rows


def write_teacher_forced(model, pad: int, rows: list[tuple[list[int], list[int]]], out: Path, cfg: TeacherForcedConfig) -> None:
    from safetensors.torch import save_file

    capture = Capture(model, list(cfg.layers))
    t0, done, bs = time.time(), 0, cfg.batch_size
    drop_stale(out, [[(p + r, len(p)) for p, r in rows[s:s + bs]] for s in range(0, len(rows), bs)], False)
    for s in range(0, len(rows), bs):
        path = shard_path(out, s // bs)
        batch = rows[s:s + bs]
        if path.exists():  # holds this slot's sequences (drop_stale)
            continue
        res = teacher_forced_batch(model, [p + r for p, r in batch], pad, capture)
        lens = torch.tensor([0] + [len(x[0]) for x in res])
        tensors = {"input_ids": torch.cat([torch.tensor(x[0]) for x in res]), "offsets": lens.cumsum(0),
                   "prompt_lens": torch.tensor([len(p) for p, _ in batch]), "features": torch.cat([x[1] for x in res]),
                   "final_hidden": torch.cat([x[2] for x in res]), "target_pred": torch.cat([x[3] for x in res])}
        with shielded():
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp))
            tmp.replace(path)
        done += sum(len(r) for _, r in batch)
        log.info("teacher-forced shard %d/%d: %d response tokens, %.1f tok/s", s // bs + 1, (len(rows) + bs - 1) // bs,
                 done, done / (time.time() - t0))
    capture.remove()


def load_shards(data_dir: str) -> list[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return [load_file(str(p)) for p in sorted(Path(data_dir).glob("shard_*.safetensors"))]
