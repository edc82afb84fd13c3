"""GRPO maths in pure torch: advantages, log-probs, KL, masks, losses and diagnostics.

No Lightning or Hydra here; every function takes tensors and plain values (paper.md, design.md §1).
"""

from grpolab.algo.advantages import AdvantageResult, compute_advantages, group_reward_summary
from grpolab.algo.diagnostics import c_weight, policy_sampler_divergence, surrogate, theorem1_lower_bound
from grpolab.algo.kl import kl_penalty, masked_mean
from grpolab.algo.logprobs import entropy_from_logits, selective_log_softmax, token_log_probs
from grpolab.algo.losses import (
    LossConfig,
    clip_bounds,
    grpo_loss,
    loss_denominator,
    loss_stats_to_metrics,
    merge_loss_stats,
)
from grpolab.algo.masks import CompletionMask, completion_mask
from grpolab.algo.sampling_correction import sampling_mismatch_metrics, truncated_importance_weights

__all__ = [
    "AdvantageResult",
    "CompletionMask",
    "LossConfig",
    "c_weight",
    "clip_bounds",
    "completion_mask",
    "compute_advantages",
    "entropy_from_logits",
    "grpo_loss",
    "group_reward_summary",
    "kl_penalty",
    "loss_denominator",
    "loss_stats_to_metrics",
    "masked_mean",
    "merge_loss_stats",
    "policy_sampler_divergence",
    "sampling_mismatch_metrics",
    "selective_log_softmax",
    "surrogate",
    "theorem1_lower_bound",
    "token_log_probs",
    "truncated_importance_weights",
]
