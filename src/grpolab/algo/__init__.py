"""GRPO maths in pure torch: advantages, log-probs, KL, masks, losses and diagnostics.

No Lightning or Hydra here; every function takes tensors and plain values. Policy-loss variants
(``algo.clip_mode``) and aggregations (``algo.loss_type``) are registries: :func:`register_policy_loss`,
:func:`register_aggregation`.
"""

from grpolab.algo.advantages import AdvantageResult, compute_advantages, group_reward_summary
from grpolab.algo.aggregation import get_aggregation, loss_denominator, register_aggregation, step_denominator
from grpolab.algo.diagnostics import c_weight, policy_sampler_divergence, surrogate, theorem1_lower_bound
from grpolab.algo.kl import kl_penalty, masked_mean
from grpolab.algo.logprobs import entropy_from_logits, selective_log_softmax, token_log_probs
from grpolab.algo.loss_config import LossConfig
from grpolab.algo.losses import grpo_loss, loss_stats_to_metrics, merge_loss_stats
from grpolab.algo.masks import CompletionMask, completion_mask
from grpolab.algo.policy_loss import (
    PolicyLossInputs,
    clip_bounds,
    clipped_surrogate,
    get_policy_loss,
    importance_ratios,
    register_policy_loss,
)
from grpolab.algo.sampling_correction import sampling_mismatch_metrics, truncated_importance_weights

__all__ = [
    "AdvantageResult",
    "CompletionMask",
    "LossConfig",
    "PolicyLossInputs",
    "c_weight",
    "clip_bounds",
    "clipped_surrogate",
    "completion_mask",
    "compute_advantages",
    "entropy_from_logits",
    "get_aggregation",
    "get_policy_loss",
    "grpo_loss",
    "group_reward_summary",
    "importance_ratios",
    "kl_penalty",
    "loss_denominator",
    "loss_stats_to_metrics",
    "masked_mean",
    "merge_loss_stats",
    "policy_sampler_divergence",
    "register_aggregation",
    "register_policy_loss",
    "sampling_mismatch_metrics",
    "selective_log_softmax",
    "step_denominator",
    "surrogate",
    "theorem1_lower_bound",
    "token_log_probs",
    "truncated_importance_weights",
]
