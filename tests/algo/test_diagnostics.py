"""Diagnostics of docs/guide/objective.md#theorem-1"""

import doctest
import math

import pytest
import torch

import grpolab.algo.diagnostics as diag_mod
from grpolab.algo import c_weight, policy_sampler_divergence, surrogate, theorem1_lower_bound


def test_doctests():
    assert doctest.testmod(diag_mod, extraglobs={"torch": torch}).failed == 0


@pytest.mark.parametrize(
    ("p", "expected"),
    # c = (1 - sqrt(p(1-p))) / sqrt(p(1-p)): 0.5 -> 0.5/0.5; 0.3 -> 0.54174/0.45826; 0.1 -> 0.7/0.3;
    # 0.05 -> 0.78206/0.21794; 0.01 -> 0.90050/0.09950
    [(0.5, 1.0), (0.3, 1.18), (0.1, 2.33), (0.05, 3.59), (0.01, 9.05)],
)
def test_c_weight_reference_values(p, expected):
    c = c_weight(torch.tensor(math.sqrt(p * (1 - p))), 1e-8)
    assert c.item() == pytest.approx(expected, abs=0.006)


def test_c_weight_floor_and_validation():
    # p = 0: c = 1/sqrt(eps) - 1 = 99 for eps 1e-4
    assert c_weight(torch.tensor(0.0), 1e-4).item() == pytest.approx(99.0, rel=1e-5)
    assert math.isinf(c_weight(torch.tensor(0.0), 0.0).item())
    with pytest.raises(ValueError, match="algo.advantage_epsilon"):
        c_weight(torch.tensor(0.5), -1.0)


def test_policy_sampler_divergence_hand_values():
    nan = math.nan
    s = torch.zeros(3, 2)
    logp = torch.tensor([[math.log(2), 0.0], [math.log(0.25), nan], [nan, nan]])  # NaN only at padding
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)
    d = policy_sampler_divergence(logp, s, mask)
    # token ratios 2, 1, 0.25 -> |r - 1| = 1, 0, 0.75 -> tv_token = 0.5 * 1.75 / 3 = 0.291667
    assert d["tv_token"].item() == pytest.approx(0.291667, abs=1e-5)
    # sequence ratios 2, 0.25 -> tv_seq = 0.5 * (1 + 0.75) / 2 = 0.4375 (fully masked seq 2 excluded)
    assert d["tv_seq"].item() == pytest.approx(0.4375, abs=1e-5)
    # -Delta = (-0.693147, 1.386294) -> 0.346574
    assert d["kl_sampler_policy"].item() == pytest.approx(0.346574, abs=1e-5)
    assert d["log_ratio_seq_mean"].item() == pytest.approx(-0.346574, abs=1e-5)
    assert d["log_ratio_seq_max"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert d["log_ratio_seq_min"].item() == pytest.approx(math.log(0.25), abs=1e-6)
    assert d["num_sequences"].item() == 2


def test_divergence_empty_mask_is_zero_not_nan():
    d = policy_sampler_divergence(torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert all(v.item() == 0.0 for v in d.values())
    with pytest.raises(ValueError, match="shape"):
        policy_sampler_divergence(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


def test_surrogate():
    # exp(log 2) * 0.5 + exp(0) * -1 = 0 ; third row masked out
    val = surrogate(
        torch.tensor([math.log(2), 0.0, 9.0]),
        torch.tensor([0.5, -1.0, 3.0]),
        torch.tensor([True, True, False]),
    )
    assert val.item() == pytest.approx(0.0, abs=1e-6)
    assert (
        surrogate(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 1.0]), torch.tensor([True, False])).item()
        == 2.0
    )
    assert surrogate(torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError, match="shape"):
        surrogate(torch.zeros(2), torch.zeros(3), torch.ones(2, dtype=torch.bool))


def test_theorem1_lower_bound_formula_and_broadcast():
    # 0.5 - 2*2*0.1 - 2*0.05 = 0.0
    assert theorem1_lower_bound(0.5, 2.0, 0.1, 0.05).item() == pytest.approx(0.0, abs=1e-7)
    lb = theorem1_lower_bound(
        torch.tensor([1.0, 0.0]), torch.tensor([1.0, 3.0]), torch.tensor([0.1, 0.2]), 0.0
    )
    torch.testing.assert_close(lb, torch.tensor([0.8, -1.2]))


def test_theorem1_bound_holds_on_exact_discrete_distributions():
    # Completions y in {0..5}, binary rewards; exact J, TV and surrogate L_alpha(pi) = E_alpha[pi/alpha * A].
    g = torch.Generator().manual_seed(0)
    eps = 1e-4
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    for _ in range(200):
        alpha, pi, pik = (
            torch.softmax(3 * torch.randn(6, generator=g, dtype=torch.float64), 0) for _ in range(3)
        )
        mu = (alpha * r).sum()
        sigma = c_weight(torch.sqrt(mu * (1 - mu)), eps)  # c, computed from the floored std
        a_alpha = (r - mu) / torch.sqrt(mu * (1 - mu) + eps)
        L = (alpha * (pi / alpha) * a_alpha).sum()
        tv = lambda p, q: 0.5 * (p - q).abs().sum()  # noqa: E731
        lb = theorem1_lower_bound(L, sigma, tv(pi, alpha), tv(pik, alpha))
        gain = (pi * r).sum() - (pik * r).sum()
        assert gain >= lb - 1e-12
        # §3.5 identity: L = (J(pi) - J(alpha)) / sigma_eps
        assert L.item() == pytest.approx(((pi * r).sum() - mu).item() / math.sqrt(mu * (1 - mu) + eps))


def test_theorem1_group_bound_takes_per_group_products():
    from grpolab.algo.diagnostics import theorem1_group_bound

    # Group 0 (c = 1): Delta = (log 1.2, log 0.8), A = (1, -1); group 1 (c = 3): Delta = (0, log 1.5), A = (-1, 1).
    # Delta_k = 0 (pi_k = alpha). L_0 = (1.2 - 0.8)/2 = 0.2, TV_0 = 0.5 * (0.2 + 0.2)/2 = 0.1;
    # L_1 = (-1 + 1.5)/2 = 0.25, TV_1 = 0.5 * (0 + 0.5)/2 = 0.125.
    # LB = mean(0.2 - 2*1*0.1, 0.25 - 2*3*0.125) = mean(0.0, -0.5) = -0.25.
    delta = torch.log(torch.tensor([1.2, 0.8, 1.0, 1.5]))
    out = theorem1_group_bound(delta, torch.zeros(4), torch.tensor([1.0, -1.0, -1.0, 1.0]),
                               torch.tensor([5, 5, 9, 9]), torch.tensor([1.0, 1.0, 3.0, 3.0]),
                               torch.ones(4, dtype=torch.bool))
    assert out["lower_bound"].item() == pytest.approx(-0.25, abs=1e-6)
    assert out["surrogate"].item() == pytest.approx(0.225, abs=1e-6)
    assert out["c_tv"].item() == pytest.approx((0.1 + 3 * 0.125) / 2, abs=1e-6)
    # mean(c) * mean(TV) would give 0.225 - 2 * 2 * 0.1125 = -0.225, not the bound
    assert out["lower_bound"].item() != pytest.approx(-0.225, abs=1e-3)
    # TV(pi_k, alpha) enters with weight 2; masked sequences (and a group with none left) drop out.
    out = theorem1_group_bound(delta, torch.log(torch.tensor([1.1, 1.1, 1.0, 1.0])),
                               torch.tensor([1.0, -1.0, -1.0, 1.0]), torch.tensor([5, 5, 9, 9]),
                               torch.tensor([1.0, 1.0, 3.0, 3.0]), torch.tensor([True, True, False, False]))
    assert out["num_groups"].item() == 1
    assert out["lower_bound"].item() == pytest.approx(0.2 - 2 * 1 * 0.1 - 2 * 0.05, abs=1e-6)  # TV_k = 0.05
