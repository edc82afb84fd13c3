"""Log-probs with temperature (docs/guide/pitfalls.md #8, #13) and chunked entropy."""

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

import grpolab.algo.logprobs as lp_mod
from grpolab.algo import entropy_from_logits, selective_log_softmax, token_log_probs


def test_doctests():
    assert doctest.testmod(lp_mod, extraglobs={"torch": torch}).failed == 0


def test_pitfall8_temperature_divides_the_logits():
    logits = torch.tensor([[[2.0, 1.0, 0.0]]])
    tok = torch.tensor([[0]])
    # log_softmax([4, 2, 0])[0] = -log(1 + e^-2 + e^-4) = -0.14293
    got = token_log_probs(logits, tok, temperature=0.5).item()
    assert got == pytest.approx(-0.14293, abs=1e-5)
    assert got != pytest.approx(-0.40761, abs=1e-3)  # temperature ignored
    assert got != pytest.approx(-0.81521, abs=1e-3)  # log-prob divided by T
    assert token_log_probs(logits, tok).item() == pytest.approx(-0.40761, abs=1e-5)


def test_first_on_policy_ratio_is_one_in_fp32():
    # The sampler's view: Categorical over logits / T, as used when sampling.
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 3
    temp = 0.7
    dist = torch.distributions.Categorical(logits=logits / temp)
    tokens = dist.sample()
    sampler = dist.log_prob(tokens)
    trainer = token_log_probs(logits, tokens, temperature=temp)
    assert (trainer - sampler).exp().sub(1).abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selective_log_softmax_matches_full_log_softmax(dtype):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 11, generator=g, dtype=dtype, requires_grad=True)
    idx = torch.randint(0, 11, (2, 5), generator=g)
    got = selective_log_softmax(logits, idx)
    ref = F.log_softmax(logits, -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref)
    (g1,) = torch.autograd.grad(got.sum(), logits)
    (g2,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_selective_log_softmax_low_precision_rows(dtype):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 17, generator=g).to(dtype)
    idx = torch.randint(0, 17, (3, 4), generator=g)
    got = selective_log_softmax(logits, idx)
    ref = F.log_softmax(logits.float(), -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == torch.float32  # upcast per row, not rounded back to 8 mantissa bits
    torch.testing.assert_close(got, ref)


def test_selective_log_softmax_shapes():
    assert selective_log_softmax(torch.zeros(4), torch.tensor(1)).item() == pytest.approx(-math.log(4))
    with pytest.raises(ValueError, match="shape"):
        selective_log_softmax(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("temp", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_must_be_positive(temp):
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), temperature=temp)


def test_entropy_values_and_chunking():
    # logits [2,1,0]: p = (0.66524, 0.24473, 0.09003); H = -sum p log p = 0.83240
    h = entropy_from_logits(torch.tensor([2.0, 1.0, 0.0]))
    assert h.item() == pytest.approx(0.83240, abs=1e-5)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 13, generator=g)
    ref = -(F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1)
    for cs in (1, 4, 1000):
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=cs), ref)
    assert entropy_from_logits(torch.zeros(2, 3, 8)).shape == (2, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)


def test_entropy_with_masked_logits_is_finite():
    # -inf logits (top-k masking): 0 * log 0 must count as 0, not NaN.
    h = entropy_from_logits(torch.tensor([[0.0, 0.0, -math.inf], [0.0, -math.inf, -math.inf]]))
    torch.testing.assert_close(h, torch.tensor([math.log(2), 0.0]))
    assert entropy_from_logits(torch.zeros(4, 6, dtype=torch.bfloat16)).dtype == torch.float32


def test_bf16_logits_are_upcast_before_the_temperature():
    # Dividing bf16 logits by the temperature in bf16 would round them; the result must match the float32
    # computation on the same (bf16-representable) logits.
    torch.manual_seed(0)
    logits = (torch.randn(2, 3, 50) * 8).bfloat16()
    ids = torch.randint(0, 50, (2, 3))
    got = token_log_probs(logits, ids, temperature=0.7)
    want = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, ids[..., None])[..., 0]
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-6)
