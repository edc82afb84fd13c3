"""KL estimators and masked mean (docs/guide/pitfalls.md #10)."""

import doctest
import math

import pytest
import torch

import grpolab.algo.kl as kl_mod
from grpolab.algo import kl_penalty, masked_mean


def test_doctests():
    assert doctest.testmod(kl_mod, extraglobs={"torch": torch}).failed == 0


def test_pitfall10_k3_values_and_argument_order():
    t = torch.tensor
    assert kl_penalty(t(-1.0), t(-1.0)).item() == 0.0
    # d = ref - logp = -1: e^-1 + 1 - 1 = 0.36788
    assert kl_penalty(t(-1.0), t(-2.0)).item() == pytest.approx(0.36788, abs=1e-5)
    # swapped, d = +1: e - 1 - 1 = 0.71828
    assert kl_penalty(t(-2.0), t(-1.0)).item() == pytest.approx(0.71828, abs=1e-5)


def test_pitfall10_k3_gradient():
    # d k3 / d logp = 1 - exp(ref - logp) = 1 - e^-1 = 0.63212
    logp = torch.tensor(-1.0, requires_grad=True)
    kl_penalty(logp, torch.tensor(-2.0), "k3").backward()
    assert logp.grad.item() == pytest.approx(0.63212, abs=1e-5)


def test_estimators_differ():
    logp, ref = torch.tensor(-1.0), torch.tensor(-2.0)
    vals = {e: kl_penalty(logp, ref, e).item() for e in ("k1", "k2", "k3")}
    assert vals["k1"] == pytest.approx(1.0)  # logp - ref
    assert vals["k2"] == pytest.approx(0.5)  # 0.5 * 1^2
    assert vals["k3"] == pytest.approx(0.36788, abs=1e-5)
    assert len({round(v, 4) for v in vals.values()}) == 3


def test_k3_no_clamp_and_precision():
    # No clamp: large gaps give large values (e^20 - 21), -inf reference gives inf for the NaN check.
    big = kl_penalty(torch.tensor(0.0), torch.tensor(20.0)).item()
    assert big == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert math.isinf(kl_penalty(torch.tensor(0.0), torch.tensor(-math.inf)).item())
    # expm1 keeps k3 ~ d^2/2 accurate in fp32 for tiny d (exp(d)-d-1 would be pure round-off here).
    small = kl_penalty(torch.tensor(0.0), torch.tensor(1e-4)).item()
    assert small == pytest.approx(5.0e-9, rel=1e-2)


def test_validation():
    with pytest.raises(ValueError, match="algo.kl_estimator"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="shape"):
        kl_penalty(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        masked_mean(torch.zeros(2), torch.ones(3))


def test_kl_row_with_padding_is_mean_over_real_tokens():
    # row 0: real tokens (logp, ref) = (-1,-2), (-1,-1); pad with garbage; row 1: fully padded.
    logp = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    ref = torch.tensor([[-2.0, -1.0, -math.inf], [math.nan, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    kl = kl_penalty(logp, ref)
    # mean over the 2 real tokens: (0.36788 + 0) / 2 = 0.18394 (over 3 slots it would be inf / 0.12263)
    assert masked_mean(kl, mask).item() == pytest.approx(0.18394, abs=1e-5)
    per_row = masked_mean(kl, mask, dim=1)
    torch.testing.assert_close(per_row, torch.tensor([0.18394, 0.0]), atol=1e-5, rtol=0)
    assert masked_mean(kl, mask, dim=1, keepdim=True).shape == (2, 1)


def test_masked_mean_empty_is_zero_with_zero_grad():
    x = torch.tensor([1.0, math.nan], requires_grad=True)
    out = masked_mean(x, torch.tensor([False, False]))
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_expected_gradient_of_each_estimator_as_a_loss_term(estimator):
    # Exact expectation over a 4-action categorical pi(theta): E_{y~pi}[grad_theta k(logp_y, ref_y)], with the
    # sample y fixed (as in the loss). k1 -> 0; k2 -> grad KL(pi||ref); k3 -> grad KL(ref||pi) (TRL).
    theta = torch.tensor([0.3, -0.2, 1.0, 0.1], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64).log()
    logp = theta.log_softmax(0)
    probs = logp.exp().detach()
    per_action = kl_penalty(logp, ref, estimator)
    (expected,) = torch.autograd.grad((probs * per_action).sum(), theta, retain_graph=True)  # samples fixed
    kl_pi_ref = (logp.exp() * (logp - ref)).sum()
    kl_ref_pi = (ref.exp() * (ref - logp)).sum()
    target = {"k1": torch.zeros(4, dtype=torch.float64),
              "k2": torch.autograd.grad(kl_pi_ref, theta, retain_graph=True)[0],
              "k3": torch.autograd.grad(kl_ref_pi, theta)[0]}[estimator]
    torch.testing.assert_close(expected, target)
    assert estimator == "k1" or target.abs().max() > 1e-3


def test_k1_with_beta_warns_at_config_validation(caplog):
    from grpolab.config import GRPOConfig

    with caplog.at_level("WARNING", logger="grpolab.config"):
        GRPOConfig(kl_estimator="k1", beta=0.0)
        GRPOConfig(kl_estimator="k3", beta=0.04)
    assert not caplog.records
    with caplog.at_level("WARNING", logger="grpolab.config"):
        GRPOConfig(kl_estimator="k1", beta=0.04)
    assert any("algo.kl_estimator=k1" in r.getMessage() and "zero expected gradient" in r.getMessage()
               for r in caplog.records)
