"""Pure verification rules: match (greedy / sampled), relaxed, rejection."""

from __future__ import annotations

import math

import pytest
import torch

from device_check import SimulatedDevice
from dflash.verification.sampling import filter_logits, gumbel_noise, target_probs
from dflash.verification.verify import (NO_GAP, match_verify, match_verify_batched, rejection_verify, speculative_verify,
                           speculative_verify_batched, top2_gap)

V = 10


def onehot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """+100 at the intended token, -100 elsewhere (vLLM's hand-built logits)."""
    logits = torch.full((len(tokens), vocab), -100.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 100.0
    return logits


@pytest.mark.parametrize("draft,target,accepted", [
    ([1, 2, 3], [1, 2, 3, 4], 3),  # perfect match: bonus = target[3]
    ([1, 2, 3], [5, 2, 3, 4], 0),  # first mismatch
    ([1, 2, 3], [1, 5, 3, 4], 1),  # middle mismatch: later matches do not count
    ([1, 2, 3], [1, 2, 5, 4], 2),
    ([7], [7, 8], 1),
    ([7], [6, 8], 0),
    ([], [9], 0),  # nothing drafted (block of 1): the target's own token only
])
def test_greedy_accept_length_table(draft, target, accepted):
    res = match_verify(torch.tensor(draft, dtype=torch.long), onehot_logits(target))
    assert res.accepted_len == accepted
    assert res.next_token == target[accepted]
    assert res.target_tokens == target
    assert res.relaxed == [False] * accepted


@pytest.mark.parametrize("bad", [-1, V, V + 5])
def test_out_of_vocab_draft_raises(bad):
    with pytest.raises(ValueError):
        match_verify(torch.tensor([1, bad]), onehot_logits([1, 2, 3]))
    with pytest.raises(ValueError):
        rejection_verify(torch.tensor([bad]), torch.full((1, V), 1 / V), torch.full((2, V), 1 / V), [0.5], torch.zeros(2, V))


def test_sampled_match_is_gumbel_max_of_filtered_target():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=gen)
    g = gumbel_noise(3, [20, 21, 22, 23, 24], V)
    own = (filter_logits(logits / 0.7, 4, 0.9) + g).argmax(-1).tolist()
    res = match_verify(torch.tensor(own[:4]), logits, 0.7, 4, 0.9, g)
    assert res.accepted_len == 4 and res.next_token == own[4] and res.target_tokens == own
    wrong = [own[0], (own[1] + 1) % V, own[2], own[3]]
    res = match_verify(torch.tensor(wrong), logits, 0.7, 4, 0.9, g)
    assert res.accepted_len == 1 and res.next_token == own[1]


def test_match_result_does_not_depend_on_the_draft_beyond_acceptance():
    """Lossless whatever the draft: the emitted tokens are the target's own choices, only their count varies."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, V, generator=gen)
    g = gumbel_noise(9, list(range(6)), V)
    own = match_verify(torch.empty(0, dtype=torch.long), logits, 1.0, 0, 1.0, g).target_tokens
    for _ in range(30):
        draft = torch.randint(0, V, (5,), generator=gen)
        res = match_verify(draft, logits, 1.0, 0, 1.0, g)
        emitted = draft[: res.accepted_len].tolist() + [res.next_token]
        assert emitted == own[: res.accepted_len + 1]


def test_relaxed_threshold_greedy():
    # Row 0: p = [.5, .3, .2, 0...]; the draft's token 1 has p/pmax = 0.6.
    probs = torch.tensor([[0.5, 0.3, 0.2] + [1e-9] * (V - 3), [0.1, 0.1, 0.8] + [1e-9] * (V - 3)])
    logits = probs.log()
    draft = torch.tensor([1])
    exact = match_verify(draft, logits, acceptance_threshold=1.0)
    assert exact.accepted_len == 0 and exact.next_token == 0 and exact.relaxed == []
    loose = match_verify(draft, logits, acceptance_threshold=0.55)
    assert loose.accepted_len == 1 and loose.next_token == 2 and loose.relaxed == [True]
    assert match_verify(draft, logits, acceptance_threshold=0.65).accepted_len == 0
    # An exact match is never flagged as relaxed.
    assert match_verify(torch.tensor([0]), logits, acceptance_threshold=0.1).relaxed == [False]
    # Relaxation stops at the first token below the threshold.
    res = match_verify(torch.tensor([1, 0]), torch.cat([logits, logits[:1]]), acceptance_threshold=0.3)
    assert res.accepted_len == 1 and res.next_token == 2 and res.relaxed == [True]


def test_relaxed_threshold_under_sampling_uses_tempered_filtered_law():
    probs = torch.tensor([[0.5, 0.3, 0.2] + [0.0] * (V - 3), [0.1, 0.1, 0.8] + [0.0] * (V - 3)])
    logits = probs.clamp_min(1e-12).log()
    g = torch.zeros(2, V)  # no noise: the target's sample is the argmax
    t = 2.0  # tempered: p ∝ p^(1/2) → ratio of token 1 to token 0 = sqrt(0.6) ≈ 0.775
    assert match_verify(torch.tensor([1]), logits, t, 0, 1.0, g, acceptance_threshold=0.75).accepted_len == 1
    assert match_verify(torch.tensor([1]), logits, t, 0, 1.0, g, acceptance_threshold=0.8).accepted_len == 0
    # Outside the top-k support the ratio is 0: never accepted.
    assert match_verify(torch.tensor([2]), logits, t, 2, 1.0, g, acceptance_threshold=0.01).accepted_len == 0


def test_threshold_one_is_exact_greedy():
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        logits = torch.randn(4, V, generator=gen)
        draft = torch.randint(0, V, (3,), generator=gen)
        assert match_verify(draft, logits, acceptance_threshold=1.0) == match_verify(draft, logits)


def test_rejection_handcrafted_accept_and_resample():
    """transformers' test_speculative_sampling shape: accept 1, accept 4, reject 5 and resample 8."""
    p = torch.zeros(4, V)
    p[0, 1] = p[1, 4] = p[3, 0] = 1.0
    p[2, 5], p[2, 8] = 0.2, 0.8  # the target gives the draft's 5 only 0.2
    q = torch.zeros(3, V)
    q[0, 1] = q[1, 4] = q[2, 5] = 1.0
    g = torch.zeros(4, V)
    res = rejection_verify(torch.tensor([1, 4, 5]), q, p, [0.0, 0.0, 0.5], g)  # 0.5 * 1.0 >= 0.2: reject
    assert (res.accepted_len, res.next_token) == (2, 8)  # residual max(0, p - q) is all on 8
    res = rejection_verify(torch.tensor([1, 4, 5]), q, p, [0.0, 0.0, 0.1], g)  # 0.1 < 0.2: accept
    assert (res.accepted_len, res.next_token) == (3, 0)  # bonus from the last row
    assert res.relaxed == [False] * 3


def test_rejection_accept_probability_is_min_one_p_over_q():
    p = torch.zeros(2, V)
    p[0, 3], p[0, 4] = 0.3, 0.7
    p[1, 0] = 1.0
    q = torch.zeros(1, V)
    q[0, 3], q[0, 4] = 0.6, 0.4
    g = torch.zeros(2, V)
    # token 3: p/q = 0.5 → accepted iff u < 0.5
    assert rejection_verify(torch.tensor([3]), q, p, [0.49], g).accepted_len == 1
    assert rejection_verify(torch.tensor([3]), q, p, [0.51], g).accepted_len == 0
    # token 4: p/q > 1 → always accepted
    assert rejection_verify(torch.tensor([4]), q, p, [0.999], g).accepted_len == 1
    # on rejection of 3 the residual max(0, p - q) has mass only on 4
    assert rejection_verify(torch.tensor([3]), q, p, [0.9], g).next_token == 4


def test_rejection_draft_equals_target_never_rejects_and_no_nan():
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(4, V, generator=gen), -1)
    for trial in range(100):
        u = torch.rand(3, generator=gen).tolist()
        x = torch.multinomial(p[:3], 1, generator=gen)[:, 0]
        g = gumbel_noise(trial, [0, 1, 2, 3], V)
        res = rejection_verify(x, p[:3].clone(), p, u, g)
        assert res.accepted_len == 3 and 0 <= res.next_token < V
        assert not math.isnan(float(p.sum()))


def test_rejection_with_identical_rows_falls_back_to_p():
    """If p == q exactly at the rejected position (measure zero), the draw still comes from p, never NaN."""
    p = torch.zeros(2, V)
    p[0, 2], p[0, 7] = 0.5, 0.5
    p[1, 1] = 1.0
    q = p[:1].clone()
    res = rejection_verify(torch.tensor([2]), q, p, [1.0], torch.zeros(2, V))  # u = 1 forces a rejection
    assert res.accepted_len == 0 and res.next_token in (2, 7)


# -- device placement: every tensor the rules create follows the inputs' device ------------------------------------
def on(dev, case: tuple) -> tuple:
    return tuple(dev.put(x) if isinstance(x, torch.Tensor) else x for x in case)


def test_device_simulation_rejects_a_cpu_tensor_mixed_in():
    """The check the tests below rely on is real: a CPU operand among simulated-accelerator tensors raises, as on CUDA."""
    with SimulatedDevice() as dev:
        x = dev.put(torch.ones(3))
        with pytest.raises(RuntimeError, match="same device"):
            x | torch.zeros(3, dtype=torch.bool)
        with pytest.raises(RuntimeError, match="same device"):
            torch.eq(x[:0], torch.empty(0))  # even when empty, as on CUDA
        assert (x + torch.tensor(1.0)).device == dev.device  # a 0-dim CPU scalar is allowed
        assert torch.zeros(2, device=x.device).device == dev.device and torch.zeros(2).device.type == "cpu"
        assert (x * 2).tolist() == [2.0, 2.0, 2.0] and (x * 2).cpu().device.type == "cpu"


def match_cases() -> list[tuple]:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(5, V, generator=gen) * 3
    g = gumbel_noise(3, [20, 21, 22, 23, 24], V)
    greedy = logits.argmax(-1)
    draft = torch.tensor([int(greedy[0]), int(greedy[1]), (int(greedy[2]) + 1) % V, 0])
    none = torch.empty(0, dtype=torch.long)
    return [(draft, logits, 0.0, 0, 1.0, None, 1.0), (draft, logits, 0.0, 0, 1.0, None, 0.2),
            (draft, logits, 0.7, 4, 0.9, g, 1.0), (draft, logits, 1.3, 3, 0.8, g, 0.4),
            (none, logits[:1], 0.0, 0, 1.0, None, 1.0), (none, logits[:1], 0.8, 0, 1.0, g[:1], 1.0)]


def test_match_verify_keeps_tensors_on_the_logits_device():
    """On an accelerator (simulated) the reference rule gives the CPU Outcome and never mixes in a CPU tensor."""
    for case in match_cases():
        expected = match_verify(*case)
        with SimulatedDevice() as dev:
            assert match_verify(*on(dev, case)) == expected, case[2:]
            # Draft ids and noise on another device move to the logits' device, as the Triton dispatch does.
            assert match_verify(case[0], dev.put(case[1]), *case[2:]) == expected


def test_rejection_rules_keep_tensors_on_the_inputs_device():
    """rejection_verify on probabilities and speculative_verify on logits: CPU Outcomes on the simulated device."""
    gen = torch.Generator().manual_seed(6)
    for t, k, p in ((0.0, 0, 1.0), (0.8, 0, 1.0), (1.2, 4, 0.8)):
        logits = torch.randn(4, V, generator=gen) * 2
        q = torch.softmax(logits[:3] + torch.randn(3, V, generator=gen), -1)
        draft = torch.multinomial(q, 1, generator=gen)[:, 0]
        u, g = [0.0, 0.9, 0.3], gumbel_noise(int(t * 10), [0, 1, 2, 3], V)
        expected = rejection_verify(draft, q, target_probs(logits, t, k, p), u, g)
        assert speculative_verify(draft, q, logits, t, k, p, torch.tensor(u, dtype=torch.float64), g) == expected
        with SimulatedDevice() as dev:
            assert rejection_verify(*on(dev, (draft, q, target_probs(dev.put(logits), t, k, p))), u, dev.put(g)) == expected
            assert speculative_verify(*on(dev, (draft, q, logits, t, k, p)), u, dev.put(g)) == expected


def test_batched_reference_returns_tensors_on_the_logits_device():
    """The batched forms (the kernels' interface) return their tensors where the logits are, as the kernels do."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 4, V, generator=gen)
    draft = logits[:, :3].argmax(-1)
    draft[1, 1] = (draft[1, 1] + 1) % V
    g = torch.stack([gumbel_noise(s, [0, 1, 2, 3], V) for s in (1, 2)])
    q = torch.softmax(torch.randn(2, 3, V, generator=gen), -1)
    u = torch.rand(2, 3, generator=gen, dtype=torch.float64)
    match_expected = match_verify_batched(draft, logits, 0.0, 0, 1.0, None, 0.5)
    spec_expected = speculative_verify_batched(draft, q, logits, 0.9, 0, 1.0, u, g)
    with SimulatedDevice() as dev:
        for expected, got in ((match_expected, match_verify_batched(*on(dev, (draft, logits, 0.0, 0, 1.0, None, 0.5)))),
                              (spec_expected, speculative_verify_batched(*on(dev, (draft, q, logits, 0.9, 0, 1.0, u, g))))):
            assert all(x.device == dev.device for x in got)
            assert [x.tolist() for x in got] == [x.tolist() for x in expected]


# -- the target's margin per row ------------------------------------------------------------------------------------
def test_top2_gap_is_the_top1_minus_top2_logit_per_row():
    logits = torch.tensor([[0.5, 3.0, 2.25, -1.0], [1.0, 1.0, 0.0, 0.0], [-2.0, -3.0, -2.5, -9.0]])
    assert top2_gap(logits) == [0.75, 0.0, 0.5]  # an exact tie has gap 0
    assert top2_gap(logits.to(torch.bfloat16)) == [0.75, 0.0, 0.5]  # measured in float32 whatever comes in
    assert top2_gap(torch.empty(0, 4)) == []
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(5, 1000, generator=gen)
    ranked = wide.sort(-1, descending=True).values
    assert top2_gap(wide) == pytest.approx((ranked[:, 0] - ranked[:, 1]).tolist(), abs=0)


def test_top2_gap_without_a_runner_up_is_a_finite_never_tied_number():
    """A vocabulary of one, a runner-up at -inf, or NaN logits: NO_GAP (finite, so traces stay JSON; huge, so no
    bound calls it a tie)."""
    assert top2_gap(torch.tensor([[4.0], [-1.0]])) == [NO_GAP, NO_GAP]
    inf = math.inf
    assert top2_gap(torch.tensor([[1.0, -inf, -inf], [-inf, -inf, -inf], [math.nan, 0.0, 1.0]])) == [NO_GAP] * 3
    assert math.isfinite(NO_GAP) and NO_GAP > 1e38


def test_top2_gap_stays_on_the_logits_device():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    expected = top2_gap(logits)
    with SimulatedDevice() as dev:
        assert top2_gap(dev.put(logits)) == expected
