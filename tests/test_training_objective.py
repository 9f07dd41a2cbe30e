"""The training objective's pure pieces on hand-made tensors."""

import math

import pytest
import torch

from dflash.training.objective import (block_attention_mask, cosine_lr, default_gamma, partial_mask, position_weights,
                                       sample_anchors, weighted_loss)


def test_position_weights_follow_the_paper():
    w = position_weights(16, 7.0)
    assert w.shape == (15,)
    assert w[0] == 1.0
    assert math.isclose(float(w[7]), math.exp(-7 / 7), rel_tol=1e-6)
    assert torch.all(w[1:] < w[:-1])
    assert default_gamma(16) == 7 and default_gamma(10) == 5 and default_gamma(8) == 4


def test_anchors_are_response_tokens_with_a_full_block_of_labels():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        a = sample_anchors(prompt_len=10, seq_len=40, block_size=8, n=12, generator=gen)
        assert len(a) == 12 and len(set(a.tolist())) == 12
        assert int(a.min()) >= 10  # never a prompt token
        assert int(a.max()) + 8 - 1 <= 39  # every label inside the sequence
    # Too short a response: no anchor rather than a truncated block.
    assert sample_anchors(10, 17, 8, 4, gen).numel() == 0
    assert sample_anchors(10, 18, 8, 4, gen).tolist() == [10]


def test_block_mask_context_strictly_before_anchor_and_no_cross_block():
    anchors = torch.tensor([3, 6])
    m = block_attention_mask(anchors, ctx_len=8, block_size=2)  # [4, 8 + 4]
    assert m.shape == (4, 12)
    # Block 0 (rows 0-1): context 0..2 only; its own two block keys; not block 1.
    assert m[0, :8].tolist() == [True, True, True, False, False, False, False, False]
    assert m[1, 8:].tolist() == [True, True, False, False]
    # Block 1 (rows 2-3): context 0..5, own block only.
    assert m[3, :8].tolist() == [True] * 6 + [False] * 2
    assert m[2, 8:].tolist() == [False, False, True, True]


def test_partial_mask_keeps_anchor_clean_and_one_masked():
    gen = torch.Generator().manual_seed(1)
    full = partial_mask(5, 8, 0.0, gen)
    assert not full[:, 0].any() and full[:, 1:].all()
    part = partial_mask(400, 8, 1.0, gen)
    assert not part[:, 0].any()
    assert (part[:, 1:].sum(-1) >= 1).all()  # never a block with nothing to predict
    assert (part[:, 1:].sum(-1) < 7).float().mean() > 0.5  # most blocks really are partial


def test_weighted_loss_matches_hand_computation_and_ignores_invalid():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [5.0, 5.0, 5.0]])
    labels = torch.tensor([0, 2, 1])
    weights = torch.tensor([1.0, 0.5, 1.0])
    valid = torch.tensor([True, True, False])
    loss, m = weighted_loss(logits, labels, weights, valid)
    lp = torch.log_softmax(logits, -1)
    expect = -(1.0 * lp[0, 0] + 0.5 * lp[1, 2]) / 1.5
    assert math.isclose(float(loss), float(expect), rel_tol=1e-6)
    assert m["acc"] == 0.5
    # KL to a teacher equal to the student is zero.
    loss2, m2 = weighted_loss(logits, labels, weights, valid, teacher_logits=logits.clone(), kl_weight=1.0)
    assert m2["kl"] == pytest.approx(0.0, abs=1e-6)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)


def test_cosine_schedule_warms_up_and_decays():
    lrs = [cosine_lr(s, 100, 1.0, 0.04) for s in range(100)]
    assert lrs[0] < lrs[3] and max(lrs) == pytest.approx(1.0)
    assert lrs[-1] < 0.01


def test_on_policy_prefix_stops_at_the_first_disagreement():
    from dflash.training.objective import on_policy_prefix

    agree = torch.tensor([[True, True, False, True, True],
                          [False, False, True, True, True],
                          [True, True, True, True, False]])
    assert on_policy_prefix(agree).tolist() == [[True, True, True, False, False],
                                                [True, True, False, False, False],
                                                [True, True, True, True, True]]
