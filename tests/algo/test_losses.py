"""The GRPO loss: aggregation, masks and denominators, frozen old log-probs and REINFORCE parity
(docs/guide/pitfalls.md #1, #3, #4, #9)."""

import doctest
import math

import pytest
import torch
from loss_helpers import LOSS_TYPES, per_token_loss_inputs
from loss_helpers import loss_and_grad as _loss

import grpolab.algo.losses as losses_mod
from grpolab.algo import (
    LossConfig,
    completion_mask,
    compute_advantages,
    grpo_loss,
    loss_denominator,
    loss_stats_to_metrics,
)


def test_doctests():
    assert doctest.testmod(losses_mod, extraglobs={"torch": torch}).failed == 0


# ---------------------------------------------------------------- pitfall 3: aggregation


def test_pitfall3_token_mean_vs_sequence_mean():
    values = torch.tensor([[2.0, 2, 2, 2, 2, 6, 5, 3, 2, 4], [10.0, 3, 4, 5, 2, 3, 4, 1, 1, 3]])
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :1] = True
    inp = per_token_loss_inputs(values)
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
        # TRL: A = 0.5/(0.707107+1e-4) = 0.707006 -> 0.35350 and 0.17675 (docs/guide/pitfalls.md #3)
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
    inp = per_token_loss_inputs(values)
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
