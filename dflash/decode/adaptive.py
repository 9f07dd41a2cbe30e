"""Block-size controllers. They choose only *how many* tokens to draft, never which are emitted, so no
controller can change greedy output.

A controller sees each block's outcome and returns the next block size (anchor included: size b verifies
b - 1 draft tokens) with a human-readable reason the UI shows.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("auto", "fixed", "slow-start", "cost")


def resolve(policy: str, device_type: str) -> str:
    """The policy a request runs with: "auto" is "cost" on a CPU and "fixed" elsewhere; the others as given.

    Why: on a CPU a verify's cost grows with its block (8 tokens cost about 1.5× a one-token step on a 2-core
    AVX-512 host without native bfloat16), and a small draft's acceptance past its third position is rare, so
    the cost policy settles on short blocks and beats a fixed block of 8. On a GPU a verify of 16 costs about
    one step and the public drafts accept long blocks: the trained size, fixed, is the paper's setting.
    """
    if policy != "auto":
        return policy
    return "cost" if device_type == "cpu" else "fixed"


@dataclass(frozen=True)
class BlockOutcome:
    block_size: int
    accepted_len: int  # draft tokens accepted (0 .. block_size - 1)
    draft_ms: float
    verify_ms: float


class Controller:
    """Fixed block size; base class of the adaptive policies."""

    def __init__(self, block_size: int, min_size: int, max_size: int):
        self.min_size, self.max_size = min_size, max_size
        self.size = max(min_size, min(block_size, max_size))

    def first(self) -> tuple[int, str]:
        return self.size, f"start at {self.size}"

    def update(self, outcome: BlockOutcome) -> tuple[int, str]:
        return self.size, "fixed"


class SlowStart(Controller):
    """TCP-like: double while whole blocks are accepted, halve when a block is rejected early."""

    def update(self, outcome: BlockOutcome) -> tuple[int, str]:
        drafted = outcome.block_size - 1
        if drafted > 0 and outcome.accepted_len == drafted:
            new = min(self.max_size, self.size * 2)
            reason = f"all {drafted} accepted: grow ×2 → {new}" if new != self.size else f"all accepted, at max {new}"
        elif outcome.accepted_len + 1 < outcome.block_size // 2:
            new = max(self.min_size, self.size // 2)
            reason = (f"rejected at {outcome.accepted_len + 1}/{outcome.block_size}: halve → {new}" if new != self.size
                      else f"early rejection, at min {new}")
        else:
            new = self.size
            reason = f"accepted {outcome.accepted_len}/{drafted}: keep {new}"
        self.size = new
        return new, reason


PRIOR_ALPHA = 0.5  # acceptance assumed at every draft position before any block is seen


def expected_tokens(alphas: list[float]) -> float:
    """Tokens a block commits when draft position k is accepted with conditional probability alphas[k-1]:
    E = 1 + Σ_k Π_{j≤k} α_j (the bonus token always counts)."""
    total, run = 1.0, 1.0
    for a in alphas:
        run *= a
        total += run
    return total


class CostAware(Controller):
    """Maximise expected tokens per millisecond.

    Per-position conditional acceptance α_k = P(draft k accepted | k-1 accepted), estimated from decayed counts
    with a weak prior of 0.5, shrunk toward the pooled rate; expected tokens of a block of size b:
    E(b) = 1 + Σ_{k=1}^{b-1} Π_{j≤k} α_j. Cost of size b: a least-squares line through the decayed mean ms of
    each size seen (after the first block, one probe at the other end of the range gives the line a slope — on
    a CPU verify cost is nearly flat in b). Choose argmax E(b) / cost(b).
    """

    decay = 0.95

    def __init__(self, block_size: int, min_size: int, max_size: int):
        super().__init__(block_size, min_size, max_size)
        n = max_size
        self.reached = [1.0] * n  # index k: draft position k (1-based; index 0 unused)
        self.accepted = [PRIOR_ALPHA] * n
        self.cost_sum: dict[int, float] = {}
        self.cost_n: dict[int, float] = {}

    def alpha(self, k: int) -> float:
        # Shrunk toward the pooled rate of all positions (weight 1): a position no recent block reached borrows
        # the pooled rate instead of keeping a stale value forever (decay shrinks both counts alike), which would
        # stop the policy from ever trying larger blocks again after one early rejection there.
        pooled = sum(self.accepted[1:]) / max(sum(self.reached[1:]), 1e-9)
        return (self.accepted[k] + pooled) / (self.reached[k] + 1.0)

    def expected_tokens(self, size: int) -> float:
        return expected_tokens([self.alpha(k) for k in range(1, size)])

    def cost(self, size: int) -> float:
        means = {b: self.cost_sum[b] / self.cost_n[b] for b in self.cost_sum}
        if not means:
            return 1.0
        if len(means) == 1:
            return next(iter(means.values()))
        xs, ys = list(means), list(means.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return max(1e-3, my + max(0.0, slope) * (size - mx))

    def update(self, outcome: BlockOutcome) -> tuple[int, str]:
        for k in range(1, self.max_size):
            self.reached[k] *= self.decay
            self.accepted[k] *= self.decay
        for k in range(1, min(outcome.block_size, outcome.accepted_len + 2)):
            self.reached[k] += 1.0
            if k <= outcome.accepted_len:
                self.accepted[k] += 1.0
        b = outcome.block_size
        self.cost_sum[b] = self.cost_sum.get(b, 0.0) * self.decay + outcome.draft_ms + outcome.verify_ms
        self.cost_n[b] = self.cost_n.get(b, 0.0) * self.decay + 1.0
        if len(self.cost_sum) < 2 and self.max_size > self.min_size:
            # One measured size says nothing about how cost grows with b, and a constant cost always favours the
            # largest block: probe the other end of the range once, so a slope can be fitted.
            self.size = self.min_size if b != self.min_size else self.max_size
            return self.size, f"probe the cost of size {self.size} (only size {b} measured)"
        rates = {s: self.expected_tokens(s) / self.cost(s) for s in range(self.min_size, self.max_size + 1)}
        best = max(rates, key=lambda s: (rates[s], -s))
        self.size = best
        return best, f"E[tokens]={self.expected_tokens(best):.2f} in ~{self.cost(best):.0f} ms: best rate at {best}"


def make_controller(policy: str, block_size: int, min_size: int, max_size: int) -> Controller:
    if policy == "fixed":
        return Controller(block_size, min_size, max_size)
    if policy == "slow-start":
        return SlowStart(block_size, min_size, max_size)
    if policy == "cost":
        return CostAware(block_size, min_size, max_size)
    raise ValueError(f"adaptive: unknown policy {policy!r} (resolve 'auto' first); choose one of {', '.join(POLICIES)}")
