"""The effective sample size of importance weights (grpolab.algo.ess) against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.ess import effective_sample_size, ess_sums, log_importance_weights, normalized_ess

# two completions: weights pi/alpha 1, 2 (then padding) and 0.5, 1, 1
WEIGHTS = torch.tensor([[1.0, 2.0, 7.0], [0.5, 1.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, True, True]])


def test_token_level_by_hand():
    # w = 1, 2, 0.5, 1, 1: sum 5.5, sum of squares 1 + 4 + 0.25 + 1 + 1 = 7.25, n = 5
    assert effective_sample_size(WEIGHTS.log(), MASK) == pytest.approx(5.5**2 / (5 * 7.25), rel=1e-12)
    assert effective_sample_size(WEIGHTS.log(), MASK) == pytest.approx(0.8344827586, abs=1e-10)


def test_sequence_level_by_hand():
    # one weight per completion, the product of its tokens': 1 * 2 = 2 and 0.5 * 1 * 1 = 0.5 (padding left out)
    assert log_importance_weights(WEIGHTS.log(), MASK, "sequence").exp().tolist() == pytest.approx([2.0, 0.5])
    assert effective_sample_size(WEIGHTS.log(), MASK, "sequence") == pytest.approx(2.5**2 / (2 * 4.25), rel=1e-12)


def test_bounds_equal_weights_one_weight_and_nothing():
    n = 6
    assert effective_sample_size(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)) == 1.0  # lag 0: exactly 1
    assert effective_sample_size(torch.full((2, 3), 0.3), torch.ones(2, 3, dtype=torch.bool)) == pytest.approx(1.0)
    one = torch.full((1, n), -200.0)
    one[0, 0] = 0.0  # one weight carries everything: 1/n
    assert effective_sample_size(one, torch.ones(1, n, dtype=torch.bool)) == pytest.approx(1 / n)
    assert math.isnan(effective_sample_size(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)))
    assert math.isnan(normalized_ess(0.0, 0.0, 0))


def test_a_sequence_weight_past_float64_range_does_not_overflow():
    # log W = 800 overflows exp() in float64; relative to the largest weight it is 1, the other exp(-800) ~ 0
    log_ratio = torch.zeros(2, 800)
    log_ratio[0] = 1.0
    assert effective_sample_size(log_ratio, torch.ones(2, 800, dtype=torch.bool), "sequence") == pytest.approx(0.5)


def test_sums_shifted_alike_add_up_over_processes():
    """What each rank computes with the common shift (the largest log weight of every rank) adds up to the ESS of the
    pooled batch."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 5) * 0.3, torch.randn(4, 5) * 0.3
    ma, mb = torch.rand(3, 5) > 0.2, torch.rand(4, 5) > 0.2
    for level in ("token", "sequence"):
        la, lb = log_importance_weights(a, ma, level), log_importance_weights(b, mb, level)
        shift = max(float(la.max()), float(lb.max()))
        sa, sb = ess_sums(la, shift), ess_sums(lb, shift)
        pooled = normalized_ess(*(sa[k] + sb[k] for k in ("sum_w", "sum_w2", "n")))
        whole = effective_sample_size(torch.cat([a, b]), torch.cat([ma, mb]), level)
        assert pooled == pytest.approx(whole, rel=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="level must be one of"):
        log_importance_weights(WEIGHTS, MASK, "group")
    with pytest.raises(ValueError, match="share a shape"):
        log_importance_weights(WEIGHTS, MASK[:, :2])
