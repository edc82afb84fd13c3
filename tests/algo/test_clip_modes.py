"""The GRPO loss: clip modes, the KL term and micro-batch invariance."""

import math

import pytest
import torch
from loss_helpers import LOSS_TYPES
from loss_helpers import loss_and_grad as _loss

from grpolab.algo import (
    LossConfig,
    clip_bounds,
    grpo_loss,
    loss_denominator,
    loss_stats_to_metrics,
    merge_loss_stats,
)

# ---------------------------------------------------------------- (b) clip modes


def _one_token(r, r_anchor, a):
    """Single token with sampler log-prob log 0.5, anchor ratio r_anchor and ratio r."""
    s = torch.tensor([[math.log(0.5)]])
    return (
        s + math.log(r),
        s,
        s + math.log(r_anchor),
        torch.tensor([float(a)]),
        torch.ones(1, 1, dtype=torch.bool),
    )


def test_clip_modes_coincide_when_anchor_is_sampler():
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(4, 6, generator=g) * 3
    sampler = logp + 0.4 * torch.randn(4, 6, generator=g)  # ratios well outside [0.8, 1.2] too
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    mask = torch.rand(4, 6, generator=g) > 0.2
    for level in ("token", "sequence"):
        out = [
            _loss(
                logp,
                sampler,
                sampler,
                adv,
                mask,
                LossConfig(clip_mode=m, importance_sampling_level=level, epsilon_high=0.28),
            )
            for m in ("ppo", "offpolicy_grpo")
        ]
        torch.testing.assert_close(out[0][0], out[1][0])
        torch.testing.assert_close(out[0][1], out[1][1])
        assert out[0][2]["clip_region_sum"] == out[1][2]["clip_region_sum"] > 0


def test_clip_modes_differ_off_policy_upper():
    # r' = 1.5, r = 1.6, eps 0.2, A = +1. ppo window [0.8, 1.2]: min(1.6, 1.2) -> loss -1.2, grad 0.
    # offpolicy window [1.3, 1.7]: r unclipped -> loss -1.6, d(-r)/dlogp = -1.6.
    logp, s, anc, a, m = _one_token(1.6, 1.5, 1)
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="ppo"), denom=1.0)
    assert loss.item() == pytest.approx(-1.2) and grad.item() == 0.0 and st["clip_high_sum"] == 1
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="offpolicy_grpo"), denom=1.0)
    assert loss.item() == pytest.approx(-1.6, abs=1e-6) and grad.item() == pytest.approx(-1.6, abs=1e-6)
    assert st["clip_high_sum"] == 0 and st["anchor_ratio_sum"].item() == pytest.approx(1.5)


def test_clip_modes_differ_off_policy_lower():
    # r' = 1.5, r = 1.25, A = -1. offpolicy: r < 1.3 with A < 0 -> clipped: -min(-1.25, -1.3) = 1.3, grad 0.
    # ppo: r = 1.25 > 1.2 but A < 0 -> -min(-1.25, -1.2) = 1.25 unclipped, grad d(r)/dlogp = 1.25.
    logp, s, anc, a, m = _one_token(1.25, 1.5, -1)
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="offpolicy_grpo"), denom=1.0)
    assert loss.item() == pytest.approx(1.3) and grad.item() == 0.0 and st["clip_low_sum"] == 1
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="ppo"), denom=1.0)
    assert (
        loss.item() == pytest.approx(1.25) and grad.item() == pytest.approx(1.25) and st["clip_low_sum"] == 0
    )


def test_offpolicy_lower_end_floored_at_zero():
    # r' = 0.1, eps 0.2: window [max(-0.1, 0), 0.3] = [0, 0.3].
    lo, hi = clip_bounds(torch.tensor([0.1]), LossConfig(clip_mode="offpolicy_grpo"))
    assert lo.item() == 0.0 and hi.item() == pytest.approx(0.3)
    # r = 0.05, A = -1: inside [0, 0.3] -> loss 0.05, grad 0.05. ppo clips it at 0.8: loss 0.8, grad 0.
    logp, s, anc, a, m = _one_token(0.05, 0.1, -1)
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="offpolicy_grpo"), denom=1.0)
    assert (
        loss.item() == pytest.approx(0.05) and grad.item() == pytest.approx(0.05) and st["clip_low_sum"] == 0
    )
    loss, grad, st = _loss(logp, s, anc, a, m, LossConfig(clip_mode="ppo"), denom=1.0)
    assert loss.item() == pytest.approx(0.8) and grad.item() == 0.0 and st["clip_low_sum"] == 1


def test_asymmetric_epsilon_high():
    lo, hi = clip_bounds(torch.ones(1), LossConfig(epsilon=0.2, epsilon_high=0.28))
    assert lo.item() == pytest.approx(0.8) and hi.item() == pytest.approx(1.28)
    assert LossConfig(epsilon=0.3).eps_high == 0.3


def test_stats_follow_trl_clip_definitions():
    # seq 0 (A > 0): ratios 0.5 (low, but A > 0: not counted), 1.5 (high, counted)
    # seq 1 (A < 0): ratios 0.5 (low, counted), 1.5 (high, but A < 0: not counted)
    s = torch.full((2, 2), math.log(0.5))
    logp = s + torch.log(torch.tensor([[0.5, 1.5], [0.5, 1.5]]))
    _, _, st = _loss(logp, s, s, torch.tensor([1.0, -1.0]), torch.ones(2, 2, dtype=torch.bool), LossConfig())
    assert (st["clip_low_sum"], st["clip_high_sum"], st["clip_region_sum"]) == (1, 1, 2)
    assert st["ratio_sum"].item() == pytest.approx(4.0)
    assert st["ratio_min"].item() == pytest.approx(0.5) and st["ratio_max"].item() == pytest.approx(1.5)
    assert st["num_tokens"] == 4 and st["num_sequences"] == 2 and "kl_sum" not in st
    assert all(not v.requires_grad and v.dim() == 0 for v in st.values())
    m = loss_stats_to_metrics(st)
    assert m["clip_ratio/low_mean"] == 0.25 and m["clip_ratio/region_mean"] == 0.5 and m["ratio/mean"] == 1.0


# ---------------------------------------------------------------- KL term


def test_beta_adds_k3_per_token():
    # one token, A = 0, logp = -1, ref = -2, beta 0.5: loss 0.5 * 0.36788 = 0.18394, grad 0.5 * 0.63212
    x = torch.tensor([[-1.0]])
    cfg = LossConfig(beta=0.5)
    loss, grad, st = _loss(
        x, x, x, torch.zeros(1), torch.ones(1, 1, dtype=torch.bool), cfg, ref=x - 1, denom=1.0
    )
    assert loss.item() == pytest.approx(0.18394, abs=1e-5) and grad.item() == pytest.approx(0.31606, abs=1e-5)
    assert st["kl_sum"].item() == pytest.approx(0.36788, abs=1e-5)
    with pytest.raises(ValueError, match="ref_logp is required when algo.beta"):
        grpo_loss(x, x, x, torch.zeros(1), torch.ones(1, 1), cfg, 1.0)
    # beta 0 with a reference: KL is logged but does not enter the loss
    loss0, _, st0 = _loss(x, x, x, torch.zeros(1), torch.ones(1, 1), LossConfig(), ref=x - 1, denom=1.0)
    assert loss0.item() == 0.0 and st0["kl_sum"].item() == pytest.approx(0.36788, abs=1e-5)


# ---------------------------------------------------------------- (c) micro-batch invariance


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_sum"])
def test_micro_batch_split_does_not_change_loss_or_grad(loss_type, level):
    g = torch.Generator().manual_seed(7)
    B, T = 6, 7
    logp = -torch.rand(B, T, generator=g) * 2
    sampler = logp + 0.3 * torch.randn(B, T, generator=g)
    anchor = logp + 0.1 * torch.randn(B, T, generator=g)
    ref = logp + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[2] = False
    cfg = LossConfig(
        loss_type=loss_type,
        max_completion_length=T,
        beta=0.05,
        clip_mode="offpolicy_grpo",
        importance_sampling_level=level,
    )
    denom = loss_denominator(mask, loss_type, T)
    full_loss, full_grad, full_stats = _loss(logp, sampler, anchor, adv, mask, cfg, ref=ref, denom=denom)
    parts, grads, stats = [], [], []
    for idx in (slice(0, 2), slice(2, 4), slice(4, 6)):
        loss, grad, st = _loss(
            logp[idx], sampler[idx], anchor[idx], adv[idx], mask[idx], cfg, ref=ref[idx], denom=denom
        )
        parts.append(loss)
        grads.append(grad)
        stats.append(st)
    torch.testing.assert_close(sum(parts), full_loss)
    torch.testing.assert_close(torch.cat(grads), full_grad)
    merged = merge_loss_stats(stats)
    for k, v in full_stats.items():
        torch.testing.assert_close(merged[k], v)
    # A per-micro-batch denominator (the bug) would NOT match for token-count normalisers.
    if loss_type in ("bnpo", "dapo", "grpo"):
        local = sum(
            _loss(logp[i], sampler[i], anchor[i], adv[i], mask[i], cfg, ref=ref[i])[0] / 3
            for i in (slice(0, 2), slice(2, 4), slice(4, 6))
        )
        assert not torch.allclose(local, full_loss)
