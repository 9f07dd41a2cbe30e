"""Shared helpers for the engine tests: independent references and scripted drafters.

The references never go through `Engine`: greedy uses transformers' own `generate`, sampling a plain
no-cache loop with the per-position noise of `dflash.verification.sampling`. Scripted drafters (tests/proposers.py)
replace only the draft's *proposals* (the engine, target and verification stay real), so an oracle (always right) and
an adversary (always wrong) exercise full acceptance and full rejection of every block.
"""

from __future__ import annotations

import random

import torch

from dflash.decode.adaptive import Controller
from dflash.models.draft import DFlashDraftModel, DraftConfig
from dflash.decode.engine import Engine
from dflash.decode.events import Commit, Finished
from dflash.verification.sampling import GUMBEL_TARGET, filter_logits, gumbel_noise
from dflash.models.target import Target
from tests.proposers import OracleDrafter, ScriptedDrafter  # noqa: F401 — re-exported for the tests

# The dev machine has 2 cores shared with a training job: OpenMP spin-waiting with 2 threads makes these
# tiny models 10-40x slower than with one thread. Tiny float32 models gain nothing from more threads.
torch.set_num_threads(1)


def reference_greedy(target: Target, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """transformers' greedy generate (its own loop and cache): new tokens only, EOS included when hit."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                    eos_token_id=eos, pad_token_id=0 if eos is None else eos)
    new = out[0, len(prompt):].tolist()
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return new


def reference_sample(target: Target, prompt: list[int], n: int, temperature: float, top_k: int, top_p: float,
                     seed: int) -> list[int]:
    """Target-only sampling without the engine: a no-cache forward over the whole prefix per token, and the
    Gumbel-max draw with the noise of (seed, absolute position)."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = target.model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            g = gumbel_noise(seed, [len(seq)], logits.shape[-1], GUMBEL_TARGET)[0]
            seq.append(int((filter_logits(logits / temperature, top_k, top_p) + g).argmax()))
    return seq[len(prompt):]


class AdversarialDrafter(ScriptedDrafter):
    """Always proposes a wrong token: (the target's own token + 1) mod V."""

    def token_at(self, t: int) -> int:
        return (self.reference(t) + 1) % self.vocab_size


def with_drafter(engine: Engine, cls: type[ScriptedDrafter] | None, full_sequence: list[int]) -> Engine:
    """Draft with a scripted drafter (None: with the drafter over the engine's own draft model)."""
    engine.use_drafter(None)  # the drafter over the engine's own draft model: the scripted one's base
    if cls is not None:
        engine.use_drafter(cls(engine.drafter, full_sequence))
    return engine


class RandomController(Controller):
    """A fuzzing controller: any size in [1, max] at every step, from a seeded RNG."""

    def __init__(self, seed: int, max_size: int):
        super().__init__(1, 1, max_size)
        self.rng = random.Random(seed)

    def update(self, outcome):
        self.size = self.rng.randint(1, self.max_size)
        return self.size, "random"


class FailingTarget(Target):
    """A real target whose forward number `fail_at` (1 = the prefill) raises `error`, once."""

    def __init__(self, model, error: BaseException, fail_at: int):
        super().__init__(model, None, name="failing")
        self.error, self.fail_at, self.n = error, fail_at, 0

    def forward(self, *args, **kwargs):
        self.n += 1
        if self.n == self.fail_at:
            raise self.error
        return super().forward(*args, **kwargs)


def commits(events: list) -> list[int]:
    return [t for e in events if isinstance(e, Commit) for t in e.token_ids]


def finished(events: list) -> Finished:
    assert isinstance(events[-1], Finished)
    return events[-1]


def random_default_draft(target, block_size: int = 16, layers: int = 1, seed: int = 0) -> DFlashDraftModel:
    """A random draft with the default draft's shape (hidden 576, 9/3 heads, head_dim 64, mask id 16), sized for
    `target` (anything with hidden_size, num_layers and vocab_size: the real SmolLM2 `Target`)."""
    torch.manual_seed(seed)
    cfg = DraftConfig(hidden_size=target.hidden_size, num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, intermediate_size=1536, vocab_size=target.vocab_size, num_target_layers=target.num_layers,
                      block_size=block_size, mask_token_id=16)
    return DFlashDraftModel(cfg)
