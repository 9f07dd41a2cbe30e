"""Stage `data`: regenerate responses with the target (greedy + some sampled), batched, resumable.

Each shard `shard_NNNNN.safetensors` holds, for every sequence (chat-templated prompt + the target's response):
  input_ids [N] int64 (sequences concatenated), offsets [S+1], prompt_lens [S],
  features [N, k*H] bf16 — outputs of target layers `layer_ids` (the draft's context),
  final_hidden [N, H] bf16 — the target's last normed hidden state (teacher logits = lm_head(final_hidden)).
Features are captured by hooks during generation itself, so they cost no extra target pass. A shard that
exists on disk is skipped: rerunning the command resumes.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

log = logging.getLogger("dflash.train")


def chat_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """A user prompt, or a whole chat history (messages), with the chat template and the assistant's header: the
    engine's own prompt rendering, so training sees exactly the prompts generation will."""
    from dflash.target import chat_prompt_ids

    return chat_prompt_ids(tokenizer, prompt)


class Capture:
    """Forward hooks on the chosen decoder layers and the final norm."""

    def __init__(self, model, layer_ids: list[int]):
        from dflash.target import feature_module

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
    """Left-padded batched generation. Returns per row (token ids, features [T, kH], final hidden [T, H])."""
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


def run_data(target: str, out_dir: str, n_prompts: int, layer_ids: list[int], batch_size: int = 32,
             max_prompt_tokens: int = 256, max_new_tokens: int = 192, sampled_every: int = 4,
             temperature: float = 0.7, seed: int = 0, threads: int | None = None) -> None:
    """ShareGPT training prompts (chat template applied) → shards in `out_dir`."""
    from dflash.datasets import sharegpt_prompts
    from dflash.load import load_target_model

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_target_model(target)
    prompts = []
    for text in sharegpt_prompts("train"):
        ids = chat_ids(tokenizer, text)
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) >= n_prompts:
            break
    # Similar lengths in one batch: left padding to the longest prompt would otherwise dominate prefill cost.
    prompts.sort(key=len)
    write_shards(model, tokenizer, target, prompts, out_dir, layer_ids, batch_size, max_new_tokens, sampled_every,
                 temperature, seed)


def write_shards(model, tokenizer, target: str, prompts: list[list[int]], out_dir: str, layer_ids: list[int],
                 batch_size: int, max_new_tokens: int, sampled_every: int, temperature: float, seed: int) -> None:
    """Generate responses for `prompts` (token ids) in batches; one shard per batch; existing shards are kept."""
    from safetensors.torch import save_file

    from dflash.target import Target

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    stops = Target(model, tokenizer).stop_ids()
    pad = (tokenizer.pad_token_id if tokenizer is not None else None) or 0
    meta = {"target": target, "layer_ids": layer_ids, "max_new_tokens": max_new_tokens, "sampled_every": sampled_every,
            "temperature": temperature, "seed": seed, "batch_size": batch_size, "hidden_size": model.config.hidden_size,
            "num_target_layers": model.config.num_hidden_layers, "vocab_size": model.config.vocab_size}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    capture = Capture(model, layer_ids)
    gen = torch.Generator().manual_seed(seed)
    n_shards = (len(prompts) + batch_size - 1) // batch_size
    t0, done_tokens = time.time(), 0
    for s in range(n_shards):
        path = out / f"shard_{s:05d}.safetensors"
        if path.exists():
            continue
        batch = prompts[s * batch_size:(s + 1) * batch_size]
        temp = temperature if sampled_every and s % sampled_every == sampled_every - 1 else 0.0
        gen.manual_seed(seed * 100_003 + s)
        rows = generate_batch(model, batch, max_new_tokens, stops, pad, capture, temp, gen)
        ids = [torch.tensor(r[0]) for r in rows]
        lens = torch.tensor([0] + [len(x) for x in ids])
        tensors = {"input_ids": torch.cat(ids), "offsets": lens.cumsum(0), "prompt_lens": torch.tensor([len(p) for p in batch]),
                   "features": torch.cat([r[1] for r in rows]), "final_hidden": torch.cat([r[2] for r in rows])}
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"temperature": str(temp)})
        tmp.replace(path)
        done_tokens += sum(len(r[0]) - len(p) for r, p in zip(rows, batch))
        log.info("shard %d/%d (T=%.1f): %d response tokens so far, %.1f tok/s", s + 1, n_shards, temp, done_tokens,
                 done_tokens / (time.time() - t0))
    capture.remove()


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


WINDOW_BATCHES = 32  # length-sorting window, in batches


def sort_in_windows(rows: list, window: int, key) -> list:
    """Sort by length inside consecutive windows of `window` rows: batches of similar lengths (little padding)
    while every prefix of the shards stays a sample of the whole corpus, so a run stopped early (or resumed
    with a larger count) is not biased towards short conversations and keeps its shard numbering."""
    return [r for i in range(0, len(rows), window) for r in sorted(rows[i:i + window], key=key)]


def run_teacher_forced(target: str, out_dir: str, n: int, layer_ids: list[int], batch_size: int = 16,
                       max_prompt_tokens: int = 160, max_response_tokens: int = 256, threads: int | None = None,
                       turns: str = "first", min_prompt_tokens: int = 0) -> None:
    """Cheap extra data: ShareGPT's recorded replies, one teacher-forced target pass each (no generation), with
    the target's own next-token predictions stored as labels (`target_pred`). Off-policy contexts, on-policy
    labels: one forward pass per sequence instead of one per token, so several times more tokens per CPU second
    than regeneration."""
    from safetensors.torch import save_file

    from dflash.datasets import sharegpt_dialogues, sharegpt_pairs
    from dflash.load import load_target_model

    if threads:
        torch.set_num_threads(threads)
    model, tokenizer = load_target_model(target)
    model.eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    # "first": first turns deduplicated by text (the original set); "later"/"all": multi-turn histories.
    pairs = sharegpt_pairs("train") if turns == "first" else sharegpt_dialogues("train", turns)
    for prompt, reply in pairs:
        p = chat_ids(tokenizer, prompt)
        if not reply or not min_prompt_tokens < len(p) <= max_prompt_tokens:
            continue
        r = tokenizer(reply, add_special_tokens=False)["input_ids"][:max_response_tokens]
        rows.append((p, r + ([end] if len(r) < max_response_tokens and isinstance(end, int) else [])))
        if len(rows) >= n:
            break
    rows = sort_in_windows(rows, batch_size * WINDOW_BATCHES, lambda pr: len(pr[0]) + len(pr[1]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target": target, "layer_ids": layer_ids, "kind": "teacher-forced", "turns": turns,
            "prompt_tokens": [min_prompt_tokens, max_prompt_tokens],
            "hidden_size": model.config.hidden_size,
            "num_target_layers": model.config.num_hidden_layers, "vocab_size": model.config.vocab_size}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    capture = Capture(model, layer_ids)
    pad = tokenizer.pad_token_id or 0
    t0, done = time.time(), 0
    for s in range(0, len(rows), batch_size):
        path = out / f"shard_{s // batch_size:05d}.safetensors"
        if path.exists():
            continue
        batch = rows[s:s + batch_size]
        res = teacher_forced_batch(model, [p + r for p, r in batch], pad, capture)
        lens = torch.tensor([0] + [len(x[0]) for x in res])
        tensors = {"input_ids": torch.cat([torch.tensor(x[0]) for x in res]), "offsets": lens.cumsum(0),
                   "prompt_lens": torch.tensor([len(p) for p, _ in batch]), "features": torch.cat([x[1] for x in res]),
                   "final_hidden": torch.cat([x[2] for x in res]), "target_pred": torch.cat([x[3] for x in res])}
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path)
        done += sum(len(r) for _, r in batch)
        log.info("teacher-forced shard %d/%d: %d response tokens, %.1f tok/s", s // batch_size + 1,
                 (len(rows) + batch_size - 1) // batch_size, done, done / (time.time() - t0))
    capture.remove()


def load_shards(data_dir: str) -> list[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return [load_file(str(p)) for p in sorted(Path(data_dir).glob("shard_*.safetensors"))]
