"""Block-size controllers (fixed, slow start, cost-aware) with scripted outcomes; the engine-level invariance
(controllers never change the emitted tokens) is in test_engine_lossless.py."""

from __future__ import annotations

import random

import pytest

from dflash.decode.adaptive import POLICIES, BlockOutcome, Controller, CostAware, SlowStart, make_controller, resolve

CONTROLLERS = [p for p in POLICIES if p != "auto"]


def test_policies_and_factory():
    assert set(POLICIES) == {"auto", "fixed", "slow-start", "cost"}
    assert type(make_controller("fixed", 8, 2, 16)) is Controller
    assert isinstance(make_controller("slow-start", 8, 2, 16), SlowStart)
    assert isinstance(make_controller("cost", 8, 2, 16), CostAware)
    for unknown in ("tcp", "auto"):  # "auto" names a choice by device: the engine resolves it first
        with pytest.raises(ValueError, match="adaptive"):
            make_controller(unknown, 8, 2, 16)


def test_auto_is_cost_on_a_cpu_and_fixed_elsewhere():
    assert resolve("auto", "cpu") == "cost"
    assert resolve("auto", "cuda") == "fixed"
    assert resolve("auto", "mps") == "fixed"
    for policy in CONTROLLERS:  # an explicit choice is kept on every device
        assert resolve(policy, "cpu") == resolve(policy, "cuda") == policy


def test_fixed_never_changes():
    c = Controller(8, 2, 16)
    assert c.first()[0] == 8
    for acc in (0, 7, 3):
        assert c.update(BlockOutcome(8, acc, 1.0, 2.0))[0] == 8


@pytest.mark.parametrize("start,lo,hi,expected", [(32, 2, 16, 16), (1, 2, 16, 2), (5, 1, 16, 5)])
def test_initial_size_is_clamped(start, lo, hi, expected):
    for policy in CONTROLLERS:
        size, reason = make_controller(policy, start, lo, hi).first()
        assert size == expected and reason


def test_slow_start_grows_on_full_blocks_and_is_bounded():
    c = SlowStart(2, 2, 16)
    sizes = []
    size = c.first()[0]
    for _ in range(5):
        size, reason = c.update(BlockOutcome(size, size - 1, 1.0, 1.0))
        sizes.append(size)
        assert reason
    assert sizes == [4, 8, 16, 16, 16]


def test_slow_start_halves_on_early_rejection_and_is_bounded():
    c = SlowStart(16, 2, 16)
    size = c.first()[0]
    sizes = []
    for _ in range(5):
        size, _ = c.update(BlockOutcome(size, 0, 1.0, 1.0))
        sizes.append(size)
    assert sizes == [8, 4, 2, 2, 2]


def test_slow_start_keeps_on_middling_acceptance():
    c = SlowStart(8, 2, 16)
    assert c.update(BlockOutcome(8, 4, 1.0, 1.0))[0] == 8  # 5 of 8 positions: neither full nor early rejection
    assert c.update(BlockOutcome(8, 7, 1.0, 1.0))[0] == 16
    assert c.update(BlockOutcome(16, 2, 1.0, 1.0))[0] == 8  # rejected at position 3 of 16


def test_cost_expected_tokens_from_acceptance_estimate():
    c = CostAware(4, 2, 4)
    # Prior 0.5 per position: E(b) = 1 + .5 + .25 + ...
    assert c.expected_tokens(1) == 1.0
    assert c.expected_tokens(3) == pytest.approx(1.75)
    for _ in range(200):  # every block of 4 fully accepted → alpha → 1
        c.update(BlockOutcome(4, 3, 1.0, 1.0))
    assert c.alpha(1) > 0.99 and c.expected_tokens(4) > 3.9


def test_cost_picks_the_argmax_of_its_own_estimate():
    rng = random.Random(0)
    c = CostAware(8, 1, 12)
    size = c.first()[0]
    for _ in range(40):
        acc = rng.randint(0, size - 1)
        size, reason = c.update(BlockOutcome(size, acc, 2.0 + 0.3 * size, 10.0 + size * rng.uniform(0.5, 1.5)))
        if reason.startswith("probe"):  # the one exploration step while only one size has been measured
            continue
        rates = {s: c.expected_tokens(s) / c.cost(s) for s in range(1, 13)}
        best = max(rates.values())
        assert 1 <= size <= 12 and reason
        assert rates[size] == pytest.approx(best, rel=1e-9)


def simulate(policy: str, start: int, lo: int, hi: int, alpha: float, cost_ms, steps: int = 200, seed: int = 0) -> list[int]:
    """Blocks accepted position by position with probability alpha; cost_ms(b) = draft + verify time."""
    rng = random.Random(seed)
    c = make_controller(policy, start, lo, hi)
    size = c.first()[0]
    sizes = []
    for _ in range(steps):
        acc = 0
        while acc < size - 1 and rng.random() < alpha:
            acc += 1
        size, _ = c.update(BlockOutcome(size, acc, 0.2 * cost_ms(size), 0.8 * cost_ms(size)))
        sizes.append(size)
    return sizes


def best_rate(alpha: float, cost_ms, sizes) -> int:
    def expected(b):
        return sum(alpha**k for k in range(b))

    return max(sizes, key=lambda b: expected(b) / cost_ms(b))


def true_rate(alpha: float, cost_ms, b: int) -> float:
    return sum(alpha**k for k in range(b)) / cost_ms(b)


@pytest.mark.parametrize("name,alpha,cost,best", [
    # A cost step between the two allowed sizes (a GPU tile boundary): the smaller one wins by far.
    ("step", 0.9, lambda b: 10.0 if b <= 7 else 30.0, 7),
    # Flat cost and a good draft: the larger one wins (by 9%).
    ("flat", 0.9, lambda b: 50.0, 8),
])
@pytest.mark.parametrize("start", [7, 8])
def test_cost_policy_converges_to_the_better_of_two_sizes(name, alpha, cost, best, start):
    assert best_rate(alpha, cost, (7, 8)) == best
    sizes = simulate("cost", start, 7, 8, alpha, cost)
    assert sum(s == best for s in sizes[-50:]) >= 48, sizes[-50:]


@pytest.mark.parametrize("name,alpha,cost", [
    ("good-draft-flat-cost", 0.9, lambda b: 100.0 + 2.0 * b),  # the CPU case: verify cost nearly flat in b
    ("poor-draft-steep-cost", 0.3, lambda b: 20.0 + 15.0 * b),
])
@pytest.mark.parametrize("start", [2, 16])
def test_cost_policy_reaches_near_best_rate(name, alpha, cost, start):
    """Over the whole range 2..16 the chosen sizes end up within 5% of the best true tokens-per-ms rate."""
    best = best_rate(alpha, cost, range(2, 17))
    sizes = simulate("cost", start, 2, 16, alpha, cost)
    rates = [true_rate(alpha, cost, s) / true_rate(alpha, cost, best) for s in sizes[-50:]]
    assert min(rates) >= 0.95, (best, sizes[-50:])


def test_cost_policy_explores_when_started_at_the_wrong_end():
    """Started at the trained (maximum) size with a poor draft and a steep cost: it must find the small size."""
    alpha, cost = 0.1, (lambda b: 10.0 + 20.0 * b)
    sizes = simulate("cost", 16, 2, 16, alpha, cost)
    best = best_rate(alpha, cost, range(2, 17))
    assert best == 2
    assert sum(s <= 3 for s in sizes[-50:]) >= 45


def test_controllers_respect_bounds_under_random_outcomes():
    rng = random.Random(3)
    for policy in CONTROLLERS:
        for _ in range(5):
            lo = rng.randint(1, 6)
            hi = rng.randint(lo, 20)
            c = make_controller(policy, rng.randint(1, 24), lo, hi)
            size = c.first()[0]
            for _ in range(50):
                assert lo <= size <= hi
                outcome = BlockOutcome(size, rng.randint(0, max(size - 1, 0)), rng.uniform(0, 5), rng.uniform(1, 50))
                size, reason = c.update(outcome)
                assert isinstance(reason, str) and reason
