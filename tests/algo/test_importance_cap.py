"""The truncated importance weight (algo.importance_weight_cap) and the weight statistics, pinned by
hand-computed values."""

import math

import pytest
import torch

from grpolab.algo import LossConfig, grpo_loss, loss_denominator, loss_stats_to_metrics
from grpolab.algo.diagnostics import weight_quantiles
from grpolab.config import GRPOConfig

LN = math.log


def _run(logp, sampler, anchor, adv, cfg, mask=None):
    logp = torch.tensor(logp).log().requires_grad_(True)
    sampler = torch.tensor(sampler).log()
    anchor = torch.tensor(anchor).log()
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask)
    loss, stats = grpo_loss(logp, sampler, anchor, torch.tensor(adv), mask, cfg, loss_denominator(mask, cfg.loss_type))
    loss.backward()
    return float(loss.detach()), logp.grad, stats


def test_cap_truncates_first_use_weight_and_gradient():
    # pi = pi_k = 0.5 on both tokens; alpha = 0.1 (r' = 5) and 0.4 (r' = 1.25). A = +1, bnpo over 2 tokens.
    cfg = LossConfig(clip_mode="offpolicy_grpo", importance_weight_cap=2.0)
    loss, grad, stats = _run([[0.5, 0.5]], [[0.1, 0.4]], [[0.5, 0.5]], [1.0], cfg)
    # weights min(5, 2) = 2 and min(1.25, 2) = 1.25: loss = -(2 + 1.25) / 2; d loss / d logp_t = -w_t / 2
    assert loss == pytest.approx(-1.625, abs=1e-6)
    assert grad[0].tolist() == pytest.approx([-1.0, -0.625], abs=1e-6)
    # without the cap the first token weighs the full 5
    loss0, grad0, _ = _run([[0.5, 0.5]], [[0.1, 0.4]], [[0.5, 0.5]], [1.0], LossConfig(clip_mode="offpolicy_grpo"))
    assert loss0 == pytest.approx(-3.125, abs=1e-6) and grad0[0, 0] == pytest.approx(-2.5, abs=1e-6)
    m = loss_stats_to_metrics(stats)
    assert m["ratio/anchor_max"] == pytest.approx(5.0, rel=1e-5)  # the stats report the weight before the cap
    assert m["ratio/anchor_frac_above_2"] == pytest.approx(0.5)
    assert m["ratio/max"] == pytest.approx(2.0, rel=1e-5)
    # grad weight |A| r: 2 and 1.25; tokens with r > 2: none (2 is not > 2)
    assert m["ratio/grad_weight_frac_above_2"] == 0.0


def test_cap_window_is_centred_on_the_capped_weight():
    # the policy moved: pi = 0.75, pi_k = 0.5, alpha = 0.1: r = 7.5, r' = 5; cap 2 scales both by 0.4:
    # r -> 3.0, window [1.8, 2.2]; A = +1, so the clipped term 2.2 is active and the gradient is 0.
    cfg = LossConfig(clip_mode="offpolicy_grpo", importance_weight_cap=2.0)
    loss, grad, stats = _run([[0.75]], [[0.1]], [[0.5]], [1.0], cfg)
    assert loss == pytest.approx(-2.2, abs=1e-5)
    assert grad.tolist() == [[0.0]]
    assert float(stats["clip_high_sum"]) == 1.0 and float(stats["grad_weight_sum"]) == 0.0
    # A = -1: min(-3, -2.2) = -3, the unclipped term is active: loss 3, gradient of 3 * logp -> +3
    loss, grad, stats = _run([[0.75]], [[0.1]], [[0.5]], [-1.0], cfg)
    assert loss == pytest.approx(3.0, abs=1e-5) and grad[0, 0] == pytest.approx(3.0, abs=1e-5)
    assert loss_stats_to_metrics(stats)["ratio/grad_weight_frac_above_2"] == pytest.approx(1.0)


def test_cap_at_sequence_sum_level_caps_the_sequence_ratio():
    # two tokens with pi_k/alpha = 2 each: sequence ratio 4, capped to 3; with grpo loss and pi = pi_k the
    # loss is -3 * A and each token's gradient is -3 * A (d s / d logp_t = s).
    cfg = LossConfig(clip_mode="offpolicy_grpo", importance_sampling_level="sequence_sum",
                     importance_weight_cap=3.0, loss_type="grpo")
    loss, grad, _ = _run([[0.5, 0.5]], [[0.25, 0.25]], [[0.5, 0.5]], [1.0], cfg)
    assert loss == pytest.approx(-3.0, abs=1e-5)
    assert grad[0].tolist() == pytest.approx([-3.0, -3.0], abs=1e-5)


def test_grad_weight_share_of_large_weights_without_cap():
    # r' = 4 and 1 (pi = pi_k): grad weights |A| r = 4*0.5 and 1*0.5; share above 2 = 2 / 2.5
    cfg = LossConfig(clip_mode="offpolicy_grpo")
    _, _, stats = _run([[0.8, 0.2]], [[0.2, 0.2]], [[0.8, 0.2]], [-0.5], cfg)
    m = loss_stats_to_metrics(stats)
    assert m["ratio/grad_weight_frac_above_2"] == pytest.approx(0.8, abs=1e-6)
    assert m["ratio/anchor_max"] == pytest.approx(4.0, rel=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    ({"clip_mode": "offpolicy_grpo", "importance_weight_cap": 0.5}, ">= 1"),
    ({"clip_mode": "offpolicy_grpo", "importance_weight_cap": math.inf}, "finite"),
    ({"clip_mode": "offpolicy_grpo", "importance_weight_cap": True}, "got True"),
    ({"clip_mode": "ppo", "importance_weight_cap": 2.0}, "clip_mode=offpolicy_grpo"),
    ({"clip_mode": "offpolicy_grpo", "ratio_reference": "anchor", "importance_weight_cap": 2.0}, "ratio_reference"),
])
def test_cap_is_validated_naming_the_key(kwargs, match):
    with pytest.raises(ValueError, match="algo.importance_weight_cap") as e:
        GRPOConfig(**kwargs)
    assert match in str(e.value)


def test_weight_quantiles_hand_computed():
    logp = torch.tensor([[LN(1.0), LN(2.0), LN(4.0), LN(100.0)]])
    mask = torch.tensor([[True, True, True, False]])  # the masked 100 must not count
    q = weight_quantiles(logp, torch.zeros(1, 4), mask, (0.5, 1.0))
    assert float(q["q50"]) == pytest.approx(2.0) and float(q["q100"]) == pytest.approx(4.0)
    assert float(weight_quantiles(logp, logp, torch.zeros(1, 4, dtype=torch.bool))["q99"]) == 1.0
