"""Engine/trainer mismatch metrics and the truncated importance-sampling correction (TRL), by hand."""

import math

import pytest
import torch

from grpolab.algo.losses import LossConfig, grpo_loss
from grpolab.algo.sampling_correction import sampling_mismatch_metrics, truncated_importance_weights
from grpolab.config import GRPOConfig


def test_truncated_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.0, -2.5, -2.0]])
    # exp(0) = 1, exp(0.5) = 1.6487, exp(1.5) = 4.4817 -> truncated at 3
    w = truncated_importance_weights(trainer, engine, 3.0)
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(0.5), 3.0]]))
    assert torch.allclose(truncated_importance_weights(trainer, engine, None)[0, 2], torch.tensor(math.exp(1.5)))
    with pytest.raises(ValueError, match="vllm_importance_sampling_cap"):
        truncated_importance_weights(trainer, engine, 0.0)
    with pytest.raises(ValueError, match="shape"):
        truncated_importance_weights(trainer, engine[:, :2], 3.0)


def test_mismatch_metrics_by_hand_and_mask():
    trainer = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 0.0, 0.0]])
    engine = torch.tensor([[-1.5, -1.0, 0.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # the 9.0 is padding and must not count
    m = sampling_mismatch_metrics(trainer, engine, mask)
    # |deltas| = 0.5, 1.0, 1.5; ratios exp(0.5), exp(-1), exp(1.5)
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx(1.0)
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(1.5)
    assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0), rel=1e-6)
    assert m["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(1.5), rel=1e-6)
    mean = (math.exp(0.5) + math.exp(-1.0) + math.exp(1.5)) / 3
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(mean, rel=1e-6)
    capped = sampling_mismatch_metrics(trainer, engine, mask, cap=3.0)  # as TRL logs it with the correction on
    assert capped["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    empty = sampling_mismatch_metrics(trainer, engine, torch.zeros_like(mask))
    assert empty["sampling/sampling_logp_difference/max"] == 0.0 and empty["sampling/importance_sampling_ratio/mean"] == 1.0


def test_token_weights_scale_each_token_loss_and_gradient():
    # On-policy (ratio 1), bnpo: per-token loss = -A; with weights w the loss is -sum(w * A) / denominator.
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    w = torch.tensor([[0.5, 3.0], [2.0, 100.0]])  # the 100 sits on a masked token
    cfg = LossConfig()
    loss, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg, 3.0, token_weights=w)
    assert loss.item() == pytest.approx(-(0.5 * 1 + 3.0 * 1 + 2.0 * -2) / 3)
    loss.backward()
    # d/dlogp of -w * A * exp(logp - sg(logp)) = -w * A on loss tokens, 0 on the masked one
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -3.0], [4.0, 0.0]]) / 3)
    plain, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg, 3.0)
    ones, _ = grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg, 3.0, token_weights=torch.ones(2, 2))
    assert plain.item() == ones.item()
    with pytest.raises(ValueError, match="token_weights"):
        grpo_loss(logp, logp.detach(), logp.detach(), adv, mask, cfg, 3.0, token_weights=torch.ones(2, 3))


@pytest.mark.parametrize("key,value", [("vllm_importance_sampling_cap", 0.5), ("vllm_importance_sampling_cap", math.inf),
                                       ("vllm_importance_sampling_correction", "yes")])
def test_config_rejects_bad_correction_knobs(key, value):
    with pytest.raises(ValueError, match=f"algo.{key}"):
        GRPOConfig(**{key: value})
