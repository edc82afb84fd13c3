"""The off-policy corrections (grpolab.algo.corrections) against values and gradients computed by hand, and one
short off-policy run per variant through the config.

The batch (eps = 0.2): row 0, A = +1: token 0 pi = 0.5, pi_k = 0.4, alpha = 0.2 (r = pi/pi_k = 1.25, above the
window; rho = pi_k/alpha = 2), token 1 pi = 0.33, pi_k = 0.3, alpha = 0.5 (r = 1.1 inside; rho = 0.6). Row 1,
A = -0.5: token 0 pi = 0.45, pi_k = 0.5, alpha = 0.25 (r = 0.9 inside; rho = 2), then a padding position.
"""

import math

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo import grpo_loss, loss_stats_to_metrics
from grpolab.algo.loss_config import LossConfig
from grpolab.app.run import run_training

PI = [[0.5, 0.33], [0.45, 0.7]]
ANCHOR = [[0.4, 0.3], [0.5, 0.7]]
ALPHA = [[0.2, 0.5], [0.25, 0.7]]
ADV = [1.0, -0.5]
MASK = [[True, True], [True, False]]


def _loss(lag: int = 0, **cfg):
    logp = torch.log(torch.tensor(PI, dtype=torch.float64)).requires_grad_(True)
    anchor = torch.log(torch.tensor(ANCHOR, dtype=torch.float64))
    sampler = torch.log(torch.tensor(ALPHA, dtype=torch.float64))
    loss, stats = grpo_loss(logp, sampler, anchor, torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK),
                            LossConfig(loss_type="bnpo", **cfg), denominator=1.0, lag=lag)  # the token sum
    loss.backward()
    return float(loss.detach()), logp.grad, loss_stats_to_metrics(stats)


# (config, loss = sum over tokens, d loss / d logp, share of the 3 loss tokens dropped)
# decoupled_ppo, w = pi_k/alpha = (2, 0.6, 2): -1.2 * 2 (clipped, no gradient) - 1.1 * 0.6 + 0.9 * 0.5 * 2;
#   gradients -r A w: token (0, 1) -1.1 * 0.6, token (1, 0) -0.9 * -0.5 * 2.
# with behaviour_weight_cap 1.5 the two tokens of weight 2 drop.
# seq_is_mask, s = (2 * 0.6, 2) = (1.2, 2): -(1.2 + 1.1) * 1.2 + 0.45 * 2; is_mask_high 1.5 drops row 1.
# geo_seq_mask, g = (sqrt(1.2), 2) = (1.095, 2): both rows are outside [0.99, 1.01], nothing is trained;
#   with is_mask_high 1.1 row 0 is back: -1.2 - 1.1.
# token_is_mask, rho = (2, 0.6, 2) inside [0.5, 5]: as decoupled_ppo; is_mask_low 0.7 drops token (0, 1).
CASES = {
    "decoupled_ppo": (dict(clip_mode="decoupled_ppo"), -2.4 - 0.66 + 0.9, [[0.0, -0.66], [0.9, 0.0]], 0),
    "decoupled_ppo_cap": (dict(clip_mode="decoupled_ppo", behaviour_weight_cap=1.5), -0.66,
                          [[0.0, -0.66], [0.0, 0.0]], 2),
    "seq_is_mask": (dict(clip_mode="seq_is_mask"), -2.3 * 1.2 + 0.9, [[0.0, -1.32], [0.9, 0.0]], 0),
    "seq_is_mask_high": (dict(clip_mode="seq_is_mask", is_mask_high=1.5), -2.3 * 1.2, [[0.0, -1.32], [0.0, 0.0]],
                         1),
    "geo_seq_mask": (dict(clip_mode="geo_seq_mask"), 0.0, [[0.0, 0.0], [0.0, 0.0]], 3),
    "geo_seq_mask_band": (dict(clip_mode="geo_seq_mask", is_mask_high=1.1), -2.3, [[0.0, -1.1], [0.0, 0.0]], 1),
    "token_is_mask": (dict(clip_mode="token_is_mask"), -2.4 - 0.66 + 0.9, [[0.0, -0.66], [0.9, 0.0]], 0),
    "token_is_mask_low": (dict(clip_mode="token_is_mask", is_mask_low=0.7), -2.4 + 0.9, [[0.0, 0.0], [0.9, 0.0]], 1),
}


@pytest.mark.parametrize("case", CASES)
def test_windowed_corrections_match_the_hand_computed_value_and_gradient(case):
    cfg, value, grad, dropped = CASES[case]
    loss, g, metrics = _loss(**cfg)
    assert loss == pytest.approx(value, abs=1e-9)
    torch.testing.assert_close(g, torch.tensor(grad, dtype=torch.float64), atol=1e-9, rtol=0)
    assert metrics["is_masked_mean"] == pytest.approx(dropped / 3)
    # the window is around pi_prox: one token above it (row 0, token 0; A > 0) is clipped
    assert metrics["clip_ratio/high_mean"] == pytest.approx(1 / 3)


def test_cispo_weights_every_token_by_its_clipped_ratio_without_gradient_through_it():
    # r = pi/alpha = (2.5, 0.66, 1.8) -> clipped (1.2, 0.8, 1.2); per token -w A log pi, gradient -w A
    loss, g, metrics = _loss(clip_mode="cispo")
    expected = -1.2 * math.log(0.5) - 0.8 * math.log(0.33) + 1.2 * 0.5 * math.log(0.45)
    assert loss == pytest.approx(expected, abs=1e-9)
    torch.testing.assert_close(g, torch.tensor([[-1.2, -0.8], [0.6, 0.0]], dtype=torch.float64), atol=1e-9, rtol=0)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(2 / 3)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert metrics["is_weight_mean"] == pytest.approx((1.2 + 0.8 + 1.2) / 3)


def test_loglinear_proximal_policy_interpolates_by_lag():
    # lag 0: pi_prox = alpha, weight 1: exactly the PPO window against the sampler (clip_mode=ppo)
    ppo = _loss(clip_mode="ppo")
    lag0 = _loss(clip_mode="decoupled_ppo", proximal_policy="loglinear", lag=0)
    assert lag0[0] == pytest.approx(ppo[0], abs=1e-12)
    torch.testing.assert_close(lag0[1], ppo[1])
    # lag 1: log pi_prox = (log alpha + log pi) / 2, so r = pi/pi_prox = w = pi_prox/alpha = sqrt(pi/alpha).
    # Row 0: sqrt(2.5) = 1.58 (clipped at 1.2), sqrt(0.66) = 0.81 (inside, active); row 1: sqrt(1.8) = 1.34
    # (above the window, but A < 0: PPO clips only below, so the term is active: -r A w = 0.5 * 1.8).
    loss, g, _ = _loss(clip_mode="decoupled_ppo", proximal_policy="loglinear", lag=1)
    s = [math.sqrt(2.5), math.sqrt(0.66), math.sqrt(1.8)]
    expected = -1.2 * s[0] - s[1] * s[1] + 0.5 * s[2] * s[2]
    assert loss == pytest.approx(expected, abs=1e-9)
    # d/dlogp of -r A w with r = exp(logp - sg(prox)) and w detached: -r A w on the active tokens
    torch.testing.assert_close(g, torch.tensor([[0.0, -s[1] * s[1]], [0.5 * s[2] * s[2], 0.0]], dtype=torch.float64),
                               atol=1e-9, rtol=0)


def test_correction_settings_are_checked_naming_the_key():
    with pytest.raises(ValueError, match="algo.behaviour_weight_cap is read by algo.clip_mode=decoupled_ppo"):
        LossConfig(clip_mode="ppo", behaviour_weight_cap=2.0)
    with pytest.raises(ValueError, match="algo.behaviour_weight_cap must be null or a finite number > 1"):
        LossConfig(clip_mode="decoupled_ppo", behaviour_weight_cap=0.5)
    with pytest.raises(ValueError, match="algo.proximal_policy must be one of"):
        LossConfig(clip_mode="decoupled_ppo", proximal_policy="recompute")
    with pytest.raises(ValueError, match="importance_sampling_level=token"):
        LossConfig(clip_mode="token_is_mask", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="0 <= low <= 1 <= high"):
        LossConfig(clip_mode="geo_seq_mask", is_mask_low=1.02)
    with pytest.raises(ValueError, match="leave algo.ratio_reference=sampler"):
        LossConfig(clip_mode="cispo", ratio_reference="anchor")


@pytest.mark.parametrize("variant", [["algo.clip_mode=decoupled_ppo", "algo.proximal_policy=loglinear"],
                                     ["algo.clip_mode=token_is_mask"]], ids=["decoupled_ppo", "token_is_mask"])
def test_corrections_train_off_policy_from_the_config(tmp_path, variant):
    # the loglinear proximal policy reads the minibatch's lag, handed from the buffer through grpo_loss
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=2",
                                       *variant, "trainer.max_steps=3", "val.at_start=false",
                                       "save_policy=false", "trainer.val_check_interval=100"])
    summary = run_training(cfg)
    assert summary["clip_mode"] == variant[0].split("=")[1]
    metrics = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    assert len(metrics) == 3 and metrics["train/loss"].map(math.isfinite).all()
    assert {"train/is_masked_mean", "train/is_weight_mean"} <= set(metrics.columns)
