"""Test proposers: drafters that propose a known token for each absolute position (`ScriptedDrafter.token_at`).

Their context handling stays that of the real draft model (`Drafter`'s K/V cache), so the engine, the target, the
verification and the draft's context path are all real; only the proposals are scripted. With the target's own output
as the script (`OracleDrafter`) every block is accepted whole, which runs the multi-token accept path and the cache
crops that an untrained draft never reaches (the tests and scripts/gpu_check.py use it for that).
"""

from __future__ import annotations

from dflash.decode.drafter import DraftContext, Drafter
from dflash.decode.proposer import Proposal


class ScriptedDrafter(Drafter):
    def __init__(self, base: Drafter, full_sequence: list[int]):
        super().__init__(base.draft, base.embed, base.lm_head_weight, base.vocab_ids, base.vocab_size)
        self.full = list(full_sequence)  # prompt + the continuation to propose
        self.calls: list[tuple[int, int, int]] = []  # (start, size, positions in the context cache) per propose

    def reference(self, t: int) -> int:
        return self.full[t] if t < len(self.full) else 0

    def token_at(self, t: int) -> int:
        raise NotImplementedError

    def propose(self, state: DraftContext, seq: list[int], size: int, n_steps: int, threshold: float,
                sample: dict | None) -> Proposal:
        start = len(seq) - 1
        self.calls.append((start, size, len(self.flush(state))))
        tokens = [self.token_at(t) for t in range(start + 1, start + size)]
        step = {"step": 0, "n_steps": n_steps, "start": start, "tokens": [seq[-1]] + tokens,
                "confidences": [1.0] * size, "masked": [False] * size, "committed": [False] + [True] * (size - 1),
                "ms": 0.0}
        return Proposal(tokens, [1.0] * len(tokens), None, [step], 0.0)


class OracleDrafter(ScriptedDrafter):
    """Always proposes the scripted continuation (give it the target's own output: every block is accepted)."""

    def token_at(self, t: int) -> int:
        return self.reference(t)
