"""The GRPO loss: docs/pitfalls.md #1, #3, #4, #9, REINFORCE parity, clip modes, micro-batch invariance,
sequence-level ratio, and LossConfig validation."""

import doctest
import math

import pytest
import torch

import grpolab.algo.losses as losses_mod
from grpolab.algo import (
    LossConfig,
    clip_bounds,
    completion_mask,
    compute_advantages,
    grpo_loss,
    loss_denominator,
    loss_stats_to_metrics,
    merge_loss_stats,
)

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def test_doctests():
    assert doctest.testmod(losses_mod, extraglobs={"torch": torch}).failed == 0


def _loss(logp, sampler, anchor, adv, mask, cfg, ref=None, denom=None):
    """Loss, gradient w.r.t. logp, stats (logp is a leaf here)."""
    logp = logp.clone().detach().requires_grad_(True)
    if denom is None:
        denom = loss_denominator(mask, cfg.loss_type, cfg.max_completion_length)
    loss, stats = grpo_loss(logp, sampler, anchor, adv, mask, cfg, denom, ref_logp=ref)
    loss.backward()
    return loss.detach(), logp.grad, stats


def _per_token_loss_inputs(values):
    """Inputs making the per-token loss equal `values`: A = 0, ratio 1, beta 1, k1 with ref = logp - v."""
    logp = torch.zeros_like(values)
    return dict(logp=logp, sampler=logp, anchor=logp, adv=torch.zeros(values.shape[0]), ref=logp - values)


# ---------------------------------------------------------------- pitfall 3: aggregation


def test_pitfall3_token_mean_vs_sequence_mean():
    values = torch.tensor([[2.0, 2, 2, 2, 2, 6, 5, 3, 2, 4], [10.0, 3, 4, 5, 2, 3, 4, 1, 1, 3]])
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :1] = True
    inp = _per_token_loss_inputs(values)
    # token mean: (5*2 + 10) / 6 = 3.3333; per-sequence: (2 + 10) / 2 = 6.0; dr_grpo: 20 / (2*10) = 1.0
    expected = {"bnpo": 20 / 6, "dapo": 20 / 6, "grpo": 6.0, "dr_grpo": 1.0}
    denoms = {"bnpo": 6.0, "dapo": 6.0, "grpo": 2.0, "dr_grpo": 20.0}
    for lt, want in expected.items():
        cfg = LossConfig(beta=1.0, kl_estimator="k1", loss_type=lt, max_completion_length=10)
        assert loss_denominator(mask, lt, 10) == denoms[lt]
        loss, _, stats = _loss(
            inp["logp"], inp["sampler"], inp["anchor"], inp["adv"], mask, cfg, ref=inp["ref"]
        )
        assert loss.item() == pytest.approx(want, abs=1e-5), lt
        assert stats["kl_sum"].item() == pytest.approx(20.0)  # padding (values 6,5,3,...) never enters


@pytest.mark.parametrize(
    ("trl_eps", "bnpo", "dr_grpo"),
    [
        # ours: A = 0.5/sqrt(0.5+1e-4) = 0.707036 -> bnpo (A*3 - A)/4 = A/2 = 0.353518, dr_grpo A/4 = 0.176759
        (False, 0.353518, 0.176759),
        # TRL: A = 0.5/(0.707107+1e-4) = 0.707006 -> 0.35350 and 0.17675 (docs/pitfalls.md #3)
        (True, 0.35350, 0.17675),
    ],
)
def test_pitfall3_group_1_0_lengths_1_and_3(trl_eps, bnpo, dr_grpo):
    res = compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    adv = res.advantages
    if trl_eps:
        adv = (torch.tensor([1.0, 0.0]) - res.group_mean) / (res.group_std + 1e-4)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    logp = torch.log(torch.tensor([[0.3, 0.5, 0.5], [0.2, 0.6, 0.9]]))
    got = {}
    for lt in LOSS_TYPES:
        cfg = LossConfig(loss_type=lt, max_completion_length=4)  # dr_grpo: B * L_max = 2 * 4
        got[lt] = _loss(logp, logp, logp, adv, mask, cfg)[0].item()  # ratio 1 (TRL's i = 1 path)
    assert got["grpo"] == pytest.approx(0.0, abs=1e-7)  # -A + A over per-sequence means
    assert got["bnpo"] == pytest.approx(bnpo, abs=1e-5)
    assert got["dapo"] == pytest.approx(bnpo, abs=1e-5)
    assert got["dr_grpo"] == pytest.approx(dr_grpo, abs=1e-5)


# ---------------------------------------------------------------- pitfall 4: masks and denominators


def test_pitfall4_truncated_tokens_leave_numerator_and_denominator():
    # 6 completions x 5 tokens = 30 tokens; 5 stop at their last token, 1 has no stop (truncated).
    ids = torch.tensor([[3, 4, 5, 6, 2]] * 5 + [[3, 4, 5, 6, 7]])
    cm = completion_mask(ids, [2])
    assert int(cm.mask.sum()) == 30 and cm.truncated.tolist() == [False] * 5 + [True]
    loss_mask = cm.mask & ~cm.truncated.unsqueeze(1)  # mask_truncated_completions
    values = torch.arange(30, dtype=torch.float32).reshape(6, 5) / 10
    inp = _per_token_loss_inputs(values)
    cfg = LossConfig(beta=1.0, kl_estimator="k1", loss_type="bnpo")
    assert loss_denominator(loss_mask, "bnpo") == 25.0
    loss = _loss(inp["logp"], inp["sampler"], inp["anchor"], inp["adv"], loss_mask, cfg, ref=inp["ref"])[0]
    valid_sum = values[:5].sum().item()  # 0.0 + ... + 2.4 = 30.0
    assert loss.item() == pytest.approx(valid_sum / 25, abs=1e-5)
    assert loss.item() != pytest.approx(valid_sum / 30, abs=1e-3)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence", "sequence_sum"])
def test_pitfall4_everything_masked_gives_zero_loss_and_finite_zero_grads(loss_type, level):
    nan, inf = math.nan, math.inf
    mask = torch.zeros(2, 3, dtype=torch.bool)
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, -9.0]])
    garbage = torch.tensor([[nan, -inf, 0.0], [inf, nan, 3.0]])  # padding values must never leak
    cfg = LossConfig(
        loss_type=loss_type,
        max_completion_length=3,
        beta=0.1,
        importance_sampling_level=level,
        clip_mode="offpolicy_grpo",
    )
    denom = loss_denominator(mask, loss_type, 3)
    assert denom == (6.0 if loss_type == "dr_grpo" else 0.0)
    loss, grad, stats = _loss(
        logp, garbage, garbage, torch.tensor([1.0, -1.0]), mask, cfg, ref=garbage, denom=denom
    )
    assert loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(2, 3))
    assert stats["num_tokens"].item() == 0 and stats["kl_sum"].item() == 0
    assert all(torch.isfinite(v) for k, v in stats.items() if not k.startswith("ratio_m"))
    assert loss_stats_to_metrics(stats)["ratio/mean"] == 1.0


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_sum"])
def test_garbage_at_masked_positions_never_reaches_loss_or_grad(level):
    # Same real tokens; padding holds clean values in one copy and NaN / -inf in the other (logp included).
    nan, inf = math.nan, math.inf
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    clean = torch.tensor([[-1.0, -2.0, -1.0], [-0.5, -1.0, -1.0]])
    dirty = torch.where(mask, clean, torch.tensor([[0.0, 0.0, nan], [0.0, -inf, nan]]))
    sampler = clean - 0.1
    ref = clean + 0.2
    cfg = LossConfig(beta=0.1, importance_sampling_level=level, clip_mode="offpolicy_grpo")
    adv = torch.tensor([1.0, -1.0])
    out_clean = _loss(clean, sampler, sampler, adv, mask, cfg, ref=ref)
    bad = torch.where(mask, 0.0, nan)
    out_dirty = _loss(dirty, sampler + bad, sampler + bad, adv, mask, cfg, ref=ref + bad)
    torch.testing.assert_close(out_dirty[0], out_clean[0])
    torch.testing.assert_close(out_dirty[1], out_clean[1])
    assert torch.isfinite(out_dirty[1]).all() and (out_dirty[1][~mask] == 0).all()
    for k, v in out_clean[2].items():
        torch.testing.assert_close(out_dirty[2][k], v)


def test_zero_denominator_with_tokens_is_an_error():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="denominator"):
        grpo_loss(x, x, x, torch.ones(1), torch.ones(1, 2, dtype=torch.bool), LossConfig(), 0.0)
    with pytest.raises(ValueError, match="denominator"):
        grpo_loss(x, x, x, torch.ones(1), torch.ones(1, 2, dtype=torch.bool), LossConfig(), -1.0)


def test_pitfall1_zero_advantage_no_policy_gradient():
    res = compute_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.zeros(4, dtype=torch.long))
    logp = torch.log(torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) * 0.9 + 0.05)
    sampler = logp - 0.3  # ratio e^0.3 != 1 to make it a real test
    loss, grad, _ = _loss(
        logp, sampler, sampler, res.advantages, torch.ones(4, 3, dtype=torch.bool), LossConfig()
    )
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros(4, 3))


# ---------------------------------------------------------------- pitfall 9: frozen old log-probs


def _toy_step(theta, old_logp, cfg):
    """One SGD (lr 1) step on -clip-objective for the two-action toy; returns (new theta, ratio, grad)."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)[0].reshape(1, 1)
    loss, _ = grpo_loss(
        logp, old_logp, old_logp, torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool), cfg, 1.0
    )
    loss.backward()
    ratio = (logp - old_logp).exp().item()
    return (theta - theta.grad).detach(), ratio, theta.grad.clone()


def test_pitfall9_old_logprobs_frozen_per_buffer():
    cfg = LossConfig(epsilon=0.2)
    frozen_old = torch.tensor([[math.log(0.5)]])  # logits [0, 0]: p(action 0) = 0.5
    theta, ratio, grad = _toy_step(torch.zeros(2), frozen_old, cfg)
    # step 1: ratio 1, d(-log p0)/dtheta = p - onehot = (-0.5, 0.5) -> theta = (0.5, -0.5)
    assert ratio == pytest.approx(1.0)
    torch.testing.assert_close(theta, torch.tensor([0.5, -0.5]))
    _, ratio2, grad2 = _toy_step(theta, frozen_old, cfg)
    # step 2: p0 = sigmoid(1) = 0.73106, ratio 1.46212 > 1.2 -> clipped, zero gradient
    assert ratio2 == pytest.approx(1.46212, abs=1e-5)
    assert torch.equal(grad2, torch.zeros(2))
    # WRONG: re-deriving "old" from the current weights gives ratio 1 and gradient (-0.26894, 0.26894)
    rederived = torch.log_softmax(theta, -1)[0].reshape(1, 1)
    _, ratio_bad, grad_bad = _toy_step(theta, rederived, cfg)
    assert ratio_bad == pytest.approx(1.0)
    torch.testing.assert_close(grad_bad, torch.tensor([-0.26894, 0.26894]), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- (a) REINFORCE parity


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_ratio_one_gradient_equals_reinforce_with_group_baseline(loss_type):
    g = torch.Generator().manual_seed(0)
    B, T, V, D = 6, 5, 7, 4
    policy = torch.nn.Linear(D, V)
    with torch.no_grad():
        policy.weight.copy_(torch.randn(V, D, generator=g))
        policy.bias.copy_(torch.randn(V, generator=g))
    feats = torch.randn(B, T, D, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[5] = False  # a masked (e.g. zero-std) sequence
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    adv = compute_advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1])).advantages
    cfg = LossConfig(loss_type=loss_type, max_completion_length=T)
    denom = loss_denominator(mask, loss_type, T)

    from grpolab.algo import token_log_probs

    logp = token_log_probs(policy(feats), tokens)
    loss, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg, denom)
    grads = torch.autograd.grad(loss, list(policy.parameters()))

    # Independent: J = sum_i w_i * A_i * log pi(y_i) / denom, log pi(y_i) = sum of masked token log-probs,
    # w_i = 1 / n_i for grpo (per-sequence token mean), 1 otherwise.
    logits = policy(feats)
    full = torch.log_softmax(logits, -1)
    seq_logpi = torch.stack(
        [
            sum(full[i, t, tokens[i, t]] for t in range(T) if mask[i, t]) if mask[i].any() else full.sum() * 0
            for i in range(B)
        ]
    )
    n = mask.sum(1).clamp(min=1).float()
    w = 1 / n if loss_type == "grpo" else torch.ones(B)
    objective = (w * adv * seq_logpi).sum() / denom
    ref_grads = torch.autograd.grad(-objective, list(policy.parameters()))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b)
    # value at ratio 1: -sum_i A_i * (w_i * n_i) / denom
    torch.testing.assert_close(loss, -(adv * w * mask.sum(1)).sum() / denom)


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


# ---------------------------------------------------------------- (d) sequence-level ratio


def test_sequence_level_ratio_values_and_gradient():
    s = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.2, 5.0], [-0.3, 0.0, 0.3]])  # 5.0 sits at a masked position
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    cfg = LossConfig(importance_sampling_level="sequence", loss_type="grpo")
    loss, grad, st = _loss(logp, s, s, adv, mask, cfg, denom=2.0)
    s0 = math.exp(0.15)  # 1.161834 inside [0.8, 1.2]; s1 = exp(0) = 1
    assert loss.item() == pytest.approx((-s0 + 1.0) / 2, abs=1e-6)  # -0.080917
    # d/dlogp_t = -A_i * s_i / n_i / denom: seq 0: -1.161834/2/2 = -0.290459; seq 1: 1/3/2 = 0.166667
    torch.testing.assert_close(grad, torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [1 / 6, 1 / 6, 1 / 6]]))
    assert st["ratio_sum"].item() == pytest.approx(2 * s0 + 3)
    # Same gradient as differentiating the sequence-level ratio s_i directly (TRL's GSPO form).
    lp = logp.clone().requires_grad_(True)
    seq = torch.stack([(lp[0, :2] - s[0, :2]).mean(), (lp[1] - s[1]).mean()]).exp()
    (-(seq * adv).sum() / 2).backward()
    torch.testing.assert_close(grad, lp.grad)


def test_sequence_level_clipping_is_per_sequence():
    # token log-ratios (0.1, 0.4): token ratios 1.105 (inside) and 1.492 (outside); sequence ratio
    # exp(0.25) = 1.284 > 1.2 with A > 0 -> the whole sequence is clipped, zero gradient on every token.
    s = torch.zeros(1, 2)
    logp = torch.tensor([[0.1, 0.4]])
    m = torch.ones(1, 2, dtype=torch.bool)
    a = torch.tensor([1.0])
    loss, grad, st = _loss(logp, s, s, a, m, LossConfig(importance_sampling_level="sequence"), denom=2.0)
    assert torch.equal(grad, torch.zeros(1, 2)) and st["clip_high_sum"] == 2
    assert loss.item() == pytest.approx(-1.2)  # -(1.2 + 1.2) / 2
    _, grad_tok, st_tok = _loss(logp, s, s, a, m, LossConfig(), denom=2.0)
    assert grad_tok[0, 0].item() == pytest.approx(-math.exp(0.1) / 2) and grad_tok[0, 1] == 0
    assert st_tok["clip_high_sum"] == 1


def test_sequence_level_offpolicy_anchor_ratio():
    # anchor log-ratios (0.4, 0.6): r' = exp(0.5) = 1.6487 -> window [1.4487, 1.8487]; policy r = exp(0.5) too
    s = torch.zeros(1, 2)
    anchor = torch.tensor([[0.4, 0.6]])
    logp = torch.tensor([[0.2, 0.8]])
    cfg = LossConfig(importance_sampling_level="sequence", clip_mode="offpolicy_grpo")
    loss, grad, st = _loss(
        logp, s, anchor, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), cfg, denom=2.0
    )
    r = math.exp(0.5)
    assert loss.item() == pytest.approx(-r, abs=1e-6) and st["clip_region_sum"] == 0
    assert st["anchor_ratio_sum"].item() == pytest.approx(2 * r, abs=1e-5)
    torch.testing.assert_close(grad, torch.full((1, 2), -r / 2))


# ---------------------------------------------------------------- (e) validation


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"epsilon": 0.0}, "algo.epsilon"),
        ({"epsilon": -0.1}, "algo.epsilon"),
        ({"epsilon": math.nan}, "algo.epsilon"),
        ({"epsilon": True}, "algo.epsilon"),
        ({"epsilon": "0.2"}, "algo.epsilon"),
        ({"epsilon_high": -0.01}, "algo.epsilon_high"),
        ({"clip_mode": "offpolicy"}, "algo.clip_mode"),
        ({"importance_sampling_level": "seq"}, "algo.importance_sampling_level"),
        ({"beta": -0.04}, "algo.beta"),
        ({"beta": math.inf}, "algo.beta"),
        ({"kl_estimator": "k4"}, "algo.kl_estimator"),
        ({"loss_type": "mean"}, "algo.loss_type"),
        ({"max_completion_length": 0}, "algo.max_completion_length"),
        ({"max_completion_length": 2.5}, "algo.max_completion_length"),
        ({"loss_type": "dr_grpo"}, "algo.max_completion_length"),
    ],
)
def test_loss_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        LossConfig(**kwargs)


def test_loss_config_defaults_and_other_validation():
    cfg = LossConfig()
    assert (cfg.epsilon, cfg.eps_high, cfg.clip_mode, cfg.loss_type, cfg.beta) == (
        0.2,
        0.2,
        "ppo",
        "bnpo",
        0.0,
    )
    with pytest.raises(ValueError, match="algo.loss_type"):
        loss_denominator(torch.ones(1, 1), "token_mean")
    with pytest.raises(ValueError, match="algo.max_completion_length"):
        loss_denominator(torch.ones(1, 1), "dr_grpo")
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, x, torch.zeros(3), torch.ones(2, 3), cfg, 1.0)
    with pytest.raises(ValueError, match="sampler_logp"):
        grpo_loss(x, torch.zeros(2, 4), x, torch.zeros(2), torch.ones(2, 3), cfg, 1.0)
    with pytest.raises(ValueError, match="0/1"):
        grpo_loss(x, x, x, torch.zeros(2), torch.full((2, 3), 0.5), cfg, 1.0)
    with pytest.raises(ValueError, match="merge_loss_stats"):
        merge_loss_stats([])


# ---------------------------------------------------------------- (f) ratio reference, sequence_sum


def test_ratio_reference_anchor_takes_the_ratio_against_pi_k():
    # Row 0: A=+1, pi=0.55, pi_k=0.5, alpha=0.25. Row 1: A=-1, pi=0.3, pi_k=0.5, alpha=0.6. eps 0.2, bnpo (/2).
    lg = torch.log
    logp = lg(torch.tensor([[0.55], [0.3]]))
    anchor = lg(torch.tensor([[0.5], [0.5]]))
    sampler = lg(torch.tensor([[0.25], [0.6]]))
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 1, dtype=torch.bool)
    # anchor: r = (1.1, 0.6): row 0 inside the window (-1.1, grad -1.1/2), row 1 clipped at 0.8 (+0.8, grad 0)
    for clip_mode in ("ppo", "offpolicy_grpo"):  # the window is centred on pi_k/pi_k = 1 in both modes
        cfg = LossConfig(ratio_reference="anchor", clip_mode=clip_mode)
        loss, grad, st = _loss(logp, sampler, anchor, adv, mask, cfg)
        assert loss.item() == pytest.approx((-1.1 + 0.8) / 2, abs=1e-6)
        torch.testing.assert_close(grad, torch.tensor([[-0.55], [0.0]]))
        assert st["ratio_max"].item() == pytest.approx(1.1) and st["ratio_min"].item() == pytest.approx(0.6)
        # the stat stays pi_k / alpha: 0.5/0.25 + 0.5/0.6
        assert st["anchor_ratio_sum"].item() == pytest.approx(2.0 + 0.5 / 0.6, abs=1e-5)
    # sampler (today): r = (2.2, 0.5), both clipped: -1.2 and +0.8, no gradient.
    loss, grad, _ = _loss(logp, sampler, anchor, adv, mask, LossConfig(ratio_reference="sampler"))
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    assert torch.equal(grad, torch.zeros(2, 1))
    # At first use (anchor = current policy) every anchor ratio is 1: TRL with a stale sampler (docs/objective.md#ratio-reference).
    loss, grad, st = _loss(logp, sampler, logp, adv, mask, LossConfig(ratio_reference="anchor"))
    assert st["ratio_min"].item() == st["ratio_max"].item() == 1.0
    torch.testing.assert_close(grad, torch.tensor([[-0.5], [0.5]]))


@pytest.mark.parametrize("level,expected", [("sequence", 1.350), ("sequence_sum", 2.460)])
def test_sequence_sum_is_the_papers_ratio_and_sequence_is_gspo(level, expected):
    # Three tokens at log-ratio 0.3: GSPO exp(mean) = 1.350, the paper's pi(y|x)/alpha(y|x) = exp(0.9) = 2.460.
    s = torch.zeros(1, 3)
    logp = torch.full((1, 3), 0.3)
    m = torch.ones(1, 3, dtype=torch.bool)
    cfg = LossConfig(importance_sampling_level=level, epsilon=0.5, epsilon_high=10.0, loss_type="grpo")
    loss, grad, st = _loss(logp, s, s, torch.tensor([1.0]), m, cfg)
    assert st["ratio_max"].item() == pytest.approx(expected, abs=5e-4)
    assert loss.item() == pytest.approx(-expected, abs=5e-4)  # grpo: one sequence, its token mean
    # The gradient of the sequence term -s * A: d s / d logp_t = s (sum) or s / 3 (mean)
    per_token = math.exp(0.9) if level == "sequence_sum" else math.exp(0.3) / 3
    torch.testing.assert_close(grad, torch.full((1, 3), -per_token))
    # Clipped as one sequence: with epsilon_high 0.2 the whole sequence is clipped, no gradient.
    cfg = LossConfig(importance_sampling_level=level, loss_type="grpo")
    _, grad, st = _loss(logp, s, s, torch.tensor([1.0]), m, cfg)
    assert torch.equal(grad, torch.zeros(1, 3)) and st["clip_high_sum"] == 3


def test_ratio_reference_is_validated():
    with pytest.raises(ValueError, match=r"algo\.ratio_reference"):
        LossConfig(ratio_reference="alpha")
