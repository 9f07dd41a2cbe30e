"""Pure sampling functions: logits filters, per-position noise, Gumbel-max sampling."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from device_check import CopiesToDevice, SimulatedDevice
from dflash.verification.sampling import (_GAMMA, _MASK64, GUMBEL_DRAFT, GUMBEL_TARGET, UNIFORM_ACCEPT, _splitmix64,
                                          filter_logits, gumbel_noise, position_seed, sample_with_noise, target_probs,
                                          uniform_noise)

NEG = float("-inf")


def test_greedy_is_argmax_and_ignores_noise():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, 0.0, 0.0, 0.0]])
    g = gumbel_noise(0, [5, 6], 4)
    assert sample_with_noise(logits, 0.0, 0, 1.0, g).tolist() == [1, 0]
    assert sample_with_noise(logits, 0.0, 0, 1.0, None).tolist() == [1, 0]
    assert sample_with_noise(logits, 1.0, 0, 1.0, None).tolist() == [1, 0]  # no noise: argmax
    assert target_probs(logits, 0.0).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_greedy_consumes_no_global_rng():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    sample_with_noise(logits, 0.0, 0, 1.0, None)
    target_probs(logits, 0.0)
    gumbel_noise(1, [1, 2, 3], 50)
    uniform_noise(1, [1, 2, 3])
    assert torch.equal(torch.get_rng_state(), state), "noise must come from per-position generators only"


@pytest.mark.parametrize("top_k,top_p,kept", [
    (0, 1.0, [0, 1, 2, 3, 4]),
    (2, 1.0, [0, 1]),
    (5, 1.0, [0, 1, 2, 3, 4]),  # k >= V: off
    (9, 1.0, [0, 1, 2, 3, 4]),
    (0, 0.5, [0]),  # p(0) = 0.5 already reaches 0.5
    (0, 0.51, [0, 1]),
    (0, 0.79, [0, 1]),  # 0.5 + 0.3 = 0.8 reaches 0.79
    (0, 0.81, [0, 1, 2]),
    (0, 1e-9, [0]),  # the top-1 fallback: always at least one token
    (3, 0.81, [0, 1]),  # top-p applies to the top-k renormalised law: [.56, .33, .11], .89 >= .81
    (3, 0.95, [0, 1, 2]),
    (2, 0.9, [0, 1]),  # both filters: the tighter wins
])
def test_filter_logits_support(top_k, top_p, kept):
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04], dtype=torch.float64)
    logits = probs.log().float()
    out = filter_logits(logits, top_k, top_p)
    assert [i for i in range(5) if out[i] > NEG] == kept
    assert torch.equal(out[kept], logits[kept])  # kept logits untouched


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (1, 2, 0, 3), (3, 2, 1, 0), (2, 0, 3, 1)])
def test_top_p_keeps_or_drops_equal_logits_together(order):
    """The mass strictly above each of two tied tokens is p(top) = 0.56 < 0.6: both stay, wherever they sit and
    whatever order a sort gives them (before: the sorted cumsum kept one, chosen by the sort; the Triton kernels kept
    both, and bfloat16 logits, which tie often, made them differ on a GPU)."""
    values = torch.tensor([2.0, 1.0, 1.0, -1.0])
    logits = torch.empty(4)
    logits[list(order)] = values
    kept = filter_logits(logits, 0, 0.6) > NEG
    assert kept[list(order)].tolist() == [True, True, True, False]
    assert (filter_logits(logits, 0, 0.5) > NEG)[list(order)].tolist() == [True, False, False, False]


def test_filter_logits_batched_rows_independent():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    out = filter_logits(logits, 2, 1.0)
    assert (out > NEG).tolist() == [[True, True, False, False], [False, False, True, True]]


def test_position_seed_depends_on_seed_position_stream():
    base = position_seed(1, 10, GUMBEL_TARGET)
    assert base == position_seed(1, 10, GUMBEL_TARGET)
    others = {position_seed(2, 10, GUMBEL_TARGET), position_seed(1, 11, GUMBEL_TARGET), position_seed(1, 10, UNIFORM_ACCEPT),
              position_seed(1, 10, GUMBEL_DRAFT)}
    assert base not in others and len(others) == 4
    assert all(0 <= s < 2**63 for s in others | {base, position_seed(2**63 - 1, 2**20, 2)})


def test_gumbel_rows_depend_only_on_their_position():
    """A row's noise is the same whether drawn alone or in a block: DFlash and target-only draw equal noise."""
    block = gumbel_noise(7, [10, 11, 12, 13], 32)
    alone = gumbel_noise(7, [12], 32)
    assert torch.equal(block[2], alone[0])
    assert torch.equal(gumbel_noise(7, [10, 11, 12, 13], 32), block)  # deterministic, 20x over
    assert all(torch.equal(gumbel_noise(7, [11], 32)[0], block[1]) for _ in range(20))
    assert not torch.equal(gumbel_noise(8, [12], 32)[0], alone[0])
    assert not torch.equal(gumbel_noise(7, [12], 32, GUMBEL_DRAFT)[0], alone[0])
    assert gumbel_noise(7, [], 32).shape == (0, 32)
    assert torch.isfinite(block).all()


def test_uniform_noise_in_unit_interval_and_deterministic():
    u = uniform_noise(3, list(range(2000)))
    assert all(0.0 <= x < 1.0 for x in u)
    assert u == uniform_noise(3, list(range(2000)))
    assert abs(sum(u) / len(u) - 0.5) < 0.03
    assert u[:10] != uniform_noise(4, list(range(10)))


def test_gumbel_max_sampling_follows_softmax():
    """argmax(logits/T + g) over per-position noise ~ softmax(logits/T): chi-square over 20k positions."""
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0, 0.2, -2.0])
    temperature = 0.7
    n = 20_000
    g = gumbel_noise(99, list(range(n)), 8)
    draws = sample_with_noise(logits.expand(n, 8), temperature, 0, 1.0, g).tolist()
    p = torch.softmax(logits / temperature, -1).tolist()
    counts = Counter(draws)
    stat = sum((counts.get(i, 0) - n * p[i]) ** 2 / (n * p[i]) for i in range(8))
    assert stat < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_sampled_tokens_stay_in_top_k_top_p_support():
    gen = torch.Generator().manual_seed(0)
    n = 5000
    logits = torch.randn(n, 40, generator=gen) * 2
    g = gumbel_noise(5, list(range(n)), 40)
    for top_k, top_p in ((5, 1.0), (0, 0.7), (10, 0.5), (1, 1.0), (0, 1e-6)):
        allowed = filter_logits(logits / 0.9, top_k, top_p) > NEG
        draws = sample_with_noise(logits, 0.9, top_k, top_p, g)
        assert allowed.gather(1, draws[:, None]).all(), (top_k, top_p)
        if top_k == 1 or top_p < 1e-3:
            assert torch.equal(draws, logits.argmax(-1))


def test_target_probs_is_normalised_filtered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = target_probs(logits, 0.5, top_k=3)
    assert p[0, 3] == 0.0
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.5, -1)
    torch.testing.assert_close(p[0, :3], expected)
    # Gumbel-max with the same filter draws from exactly this distribution's support.
    assert target_probs(logits, 1.0, top_p=1e-9).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_sampling_functions_keep_tensors_on_the_inputs_device():
    """On an accelerator (simulated: a CPU tensor mixed in raises, as on CUDA) every result stays on the logits'
    device and equals the CPU result; the noise is computed on the device from one key per position: nothing of the
    vocabulary's size is copied from the host."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 40, generator=gen) * 2
    g = gumbel_noise(5, [7, 8, 9], 40)
    with SimulatedDevice() as dev:
        x = dev.put(logits)
        with CopiesToDevice() as copies:
            noise = gumbel_noise(5, [7, 8, 9], 40, device=dev.device)
        assert noise.device == dev.device and noise.tolist() == g.tolist()
        assert max(copies.sizes, default=0) <= 3, copies.sizes  # at most the three keys
        with CopiesToDevice() as copies:
            dev.put(torch.zeros(3, 40)).add_(torch.ones(3, 40).to(dev.device))
        assert copies.sizes == [120]  # the recorder sees a host-to-device copy
        assert gumbel_noise(5, [], 40, device=dev.device).device == dev.device
        for k, p in ((0, 1.0), (5, 1.0), (0, 0.7), (9, 0.5)):
            for out, expected in ((filter_logits(x, k, p), filter_logits(logits, k, p)),
                                  (target_probs(x, 0.8, k, p), target_probs(logits, 0.8, k, p)),
                                  (sample_with_noise(x, 0.8, k, p, noise), sample_with_noise(logits, 0.8, k, p, g))):
                assert out.device == dev.device and out.tolist() == expected.tolist()
        onehot = target_probs(x, 0.0)
        assert onehot.device == dev.device and onehot.tolist() == target_probs(logits, 0.0).tolist()
        assert sample_with_noise(x, 0.0, 0, 1.0, None).tolist() == logits.argmax(-1).tolist()


def test_noise_is_a_splitmix64_stream_per_position():
    """Row i of the noise is the SplitMix64 stream seeded with position_seed(seed, positions[i], stream): the int64
    tensor arithmetic (wrapping, arithmetic shifts masked) gives the same bits as the exact Python integers."""
    for seed, pos, stream in ((0, 0, GUMBEL_TARGET), (2**40 + 7, 123_456, GUMBEL_DRAFT), (31337, 5, UNIFORM_ACCEPT)):
        key = position_seed(seed, pos, stream)
        row = gumbel_noise(seed, [pos], 49152, stream)[0]
        for j in (0, 1, 2, 777, 49151):
            u = ((_splitmix64((key + j * _GAMMA) & _MASK64) >> 40) + 0.5) / (1 << 24)
            assert row[j].item() == pytest.approx(-math.log(-math.log(u)), rel=1e-6, abs=1e-6)
        assert uniform_noise(seed, [pos], stream) == [((_splitmix64(key) >> 40) + 0.5) / (1 << 24)]
    g = gumbel_noise(11, list(range(64)), 4096)
    assert abs(g.mean().item() - 0.5772) < 0.01 and abs(g.std().item() - math.pi / math.sqrt(6)) < 0.01  # Gumbel(0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_noise_on_cuda_equals_the_cpu_noise():
    cpu = gumbel_noise(3, list(range(40, 56)), 49152, GUMBEL_DRAFT)
    gpu = gumbel_noise(3, list(range(40, 56)), 49152, GUMBEL_DRAFT, "cuda")
    assert gpu.device.type == "cuda" and torch.allclose(cpu, gpu.cpu(), rtol=1e-6, atol=1e-6)
