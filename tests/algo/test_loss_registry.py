"""The policy-loss and aggregation registries: a toy variant registered here, outside src/, is selected with
algo.clip_mode and checked against hand-computed values; unknown names list the registered ones; the
summary.json settings come from GRPOConfig.summary(). (tests/core/test_loss_variant_train.py trains with one.)"""

import doctest
import math

import pytest
import torch

import grpolab.algo.aggregation as aggregation_mod
import grpolab.algo.policy_loss as policy_loss_mod
from grpolab.algo import (
    PolicyLossInputs,
    get_aggregation,
    grpo_loss,
    loss_denominator,
    loss_stats_to_metrics,
    merge_loss_stats,
    register_policy_loss,
)
from grpolab.algo.policy_loss import POLICY_LOSSES
from grpolab.config import GRPOConfig

TOY = "toy_tis"


def _toy(inp: PolicyLossInputs, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE weighted by the truncated pi_k/alpha, dropping tokens whose pi/pi_k is above 1.5."""
    weight = (inp.anchor_logp - inp.sampler_logp).exp().clamp(max=2.0).detach()
    keep = inp.mask & ((inp.logp - inp.anchor_logp).exp() <= 1.5)
    per_token = torch.where(keep, -inp.advantages * weight * inp.logp, torch.zeros_like(inp.logp))
    with torch.no_grad():
        stats = {"toy_masked_sum": (inp.mask & ~keep).sum().to(inp.logp.dtype),
                 "toy_weight_max": torch.where(inp.mask, weight, -math.inf).max()}
    return per_token, stats


@pytest.fixture
def toy_variant():
    register_policy_loss(TOY)(_toy)
    yield TOY
    POLICY_LOSSES.pop(TOY)


def _toy_batch():
    # Row 0, A = +1: token 0 pi = pi_k = 0.5, alpha = 0.1 (weight min(5, 2) = 2); token 1 pi = 0.4, pi_k = 0.2
    # (pi/pi_k = 2 > 1.5: dropped), alpha = 0.4. Row 1, A = -0.5: one token pi = pi_k = 0.3, alpha = 0.6 (weight
    # 0.5), then padding.
    lg = torch.log
    logp = lg(torch.tensor([[0.5, 0.4], [0.3, 0.9]]))
    anchor = lg(torch.tensor([[0.5, 0.2], [0.3, 0.9]]))
    sampler = lg(torch.tensor([[0.1, 0.4], [0.6, 0.9]]))
    mask = torch.tensor([[True, True], [True, False]])
    return logp, sampler, anchor, torch.tensor([1.0, -0.5]), mask


def test_doctests():
    for mod in (policy_loss_mod, aggregation_mod):
        assert doctest.testmod(mod, extraglobs={"torch": torch}).failed == 0


def test_toy_variant_selected_by_clip_mode_gives_hand_computed_loss_and_gradient(toy_variant):
    cfg = GRPOConfig(clip_mode=toy_variant, loss_type="bnpo")
    logp, sampler, anchor, adv, mask = _toy_batch()
    logp.requires_grad_(True)
    loss, stats = grpo_loss(logp, sampler, anchor, adv, mask, cfg, loss_denominator(mask, "bnpo"))
    loss.backward()
    # bnpo over the 3 loss tokens (the variant's own drop does not change the denominator):
    # (-1 * 2 * log 0.5 + 0.5 * 0.5 * log 0.3) / 3; d/dlogp = -A * w / 3 on the kept tokens, 0 elsewhere.
    want = (-2.0 * math.log(0.5) + 0.25 * math.log(0.3)) / 3
    assert loss.item() == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0 / 3, 0.0], [0.25 / 3, 0.0]]))
    assert list(stats) == ["num_tokens", "num_sequences", "toy_masked_sum", "toy_weight_max"]
    assert stats["toy_masked_sum"].item() == 1.0 and stats["toy_weight_max"].item() == pytest.approx(2.0)
    m = loss_stats_to_metrics(stats)
    assert m["toy_masked_mean"] == pytest.approx(1 / 3) and m["toy_weight_max"] == pytest.approx(2.0)
    assert m["num_loss_tokens"] == 3.0 and "ratio/mean" not in m
    # Split into two micro-batches with the step's denominator: same loss, max merged by max.
    halves = [grpo_loss(logp[i:i + 1].detach(), sampler[i:i + 1], anchor[i:i + 1], adv[i:i + 1], mask[i:i + 1],
                        cfg, 3.0) for i in (0, 1)]
    assert sum(h[0] for h in halves).item() == pytest.approx(want, abs=1e-6)
    merged = merge_loss_stats([h[1] for h in halves])
    assert merged["toy_weight_max"].item() == pytest.approx(2.0) and merged["toy_masked_sum"].item() == 1.0


def test_variant_options_and_clashing_stats_are_refused(toy_variant):
    with pytest.raises(ValueError, match=r"algo\.importance_weight_cap is read by algo\.clip_mode=offpolicy_grpo only"):
        GRPOConfig(clip_mode=toy_variant, importance_weight_cap=2.0)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss(toy_variant)(_toy)
    register_policy_loss("toy_clash")(lambda inp, cfg: (inp.logp * 0, {"num_tokens": inp.logp.sum().detach()}))
    try:
        logp, sampler, anchor, adv, mask = _toy_batch()
        with pytest.raises(ValueError, match="generic"):
            grpo_loss(logp, sampler, anchor, adv, mask, GRPOConfig(clip_mode="toy_clash"), 3.0)
    finally:
        POLICY_LOSSES.pop("toy_clash")


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match=r"algo\.clip_mode must be one of \('ppo', 'offpolicy_grpo', "
                                         r"'decoupled_ppo', .*'cispo'\), got 'gspo_clip'"):
        GRPOConfig(clip_mode="gspo_clip")
    with pytest.raises(ValueError, match=r"algo\.loss_type must be one of \('grpo', 'bnpo', 'dr_grpo', 'dapo'\)"):
        GRPOConfig(loss_type="token_mean")


def test_aggregations_declare_their_cross_rank_rule():
    assert {n: get_aggregation(n).cross_rank for n in ("grpo", "bnpo", "dr_grpo", "dapo")} == {
        "grpo": "local", "bnpo": "local", "dr_grpo": "local", "dapo": "global"}
    assert get_aggregation("dr_grpo").requires == ("max_completion_length",)


def test_summary_holds_the_algo_settings_of_the_config():
    cfg = GRPOConfig(name="grpo_offpolicy_cap", steps_per_generation=10, clip_mode="offpolicy_grpo",
                     importance_weight_cap=2.0, mask_zero_std_groups=True, loss_type="dapo", beta=0.04,
                     learning_rate=3e-5, importance_sampling_level="sequence")
    s = cfg.summary()
    assert {k: s[k] for k in ("algo", "steps_per_generation", "num_iterations", "clip_mode", "ratio_reference",
                              "importance_sampling_level", "importance_weight_cap", "mask_zero_std_groups",
                              "loss_type", "beta", "learning_rate")} == {
        "algo": "grpo_offpolicy_cap", "steps_per_generation": 10, "num_iterations": 1,
        "clip_mode": "offpolicy_grpo", "ratio_reference": "sampler", "importance_sampling_level": "sequence",
        "importance_weight_cap": 2.0, "mask_zero_std_groups": True, "loss_type": "dapo", "beta": 0.04,
        "learning_rate": 3e-5}
    assert s["epsilon"] == 0.2 and s["max_completion_length"] == 8 and "num_generations" not in s
