"""The GRPO loss: sequence-level ratios, LossConfig validation and the ratio reference."""

import math

import pytest
import torch
from loss_helpers import loss_and_grad as _loss

from grpolab.algo import (
    LossConfig,
    grpo_loss,
    loss_denominator,
    merge_loss_stats,
)

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
    # At first use (anchor = current policy) every anchor ratio is 1: TRL with a stale sampler (docs/guide/objective.md#ratio-reference).
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
