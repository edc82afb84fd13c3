"""Train-inference mismatch between an inference engine (vLLM) and the trainer, and its truncated
importance-sampling correction (TRL's ``vllm_importance_sampling_correction``; Yao et al., "Your efficient RL
framework secretly brings you off-policy RL training", 2025).

The engine that sampled a completion and the trainer's forward pass compute the probabilities of the same
weights with different kernels (and often a different dtype), so even at lag 0 ``log alpha_engine`` and
``log alpha_trainer`` differ. This is apart from staleness (the policy moving away from the sampler's weights
between refreshes): both log-prob tensors here belong to the SAME weights.

No Lightning here: pure functions of tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def _check(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor | None = None) -> None:
    if trainer_logp.dim() != 2 or engine_logp.shape != trainer_logp.shape:
        raise ValueError(f"trainer_logp and engine_logp must share a [B, T] shape, got {tuple(trainer_logp.shape)} "
                         f"and {tuple(engine_logp.shape)}")
    if mask is not None and mask.shape != trainer_logp.shape:
        raise ValueError(f"mask must have the shape {tuple(trainer_logp.shape)}, got {tuple(mask.shape)}")


def truncated_importance_weights(trainer_logp: Tensor, engine_logp: Tensor, cap: float | None) -> Tensor:
    """Per-token weight ``min(exp(log alpha_trainer - log alpha_engine), cap)`` (TRL, ``token_truncate``).

    Multiplying each token's loss by this weight corrects for the tokens having been drawn from the engine's
    distribution rather than from the trainer's view of the same weights; the cap bounds the variance.

    Args:
        trainer_logp: ``[B, T]`` float, the trainer's log-probs of the sampled tokens under the sampler's
            weights (``log alpha`` recomputed with the training forward pass).
        engine_logp: ``[B, T]`` float, the engine's log-probs of the same tokens (vLLM's processed log-probs).
        cap: upper bound of the weight (``algo.vllm_importance_sampling_cap``, TRL default 3.0); None = no cap.

    Returns:
        ``[B, T]`` float32 weights, detached; callers mask padding out.

    Raises:
        ValueError: on shape mismatch or a cap that is not a finite number > 0.

    Example:
        >>> truncated_importance_weights(torch.tensor([[0.0, 2.0]]), torch.tensor([[0.0, 0.0]]), 3.0)
        tensor([[1., 3.]])
    """
    _check(trainer_logp, engine_logp)
    if cap is not None and not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"algo.vllm_importance_sampling_cap must be a finite number > 0, got {cap!r}")
    w = (trainer_logp.detach().to(torch.float32) - engine_logp.detach().to(torch.float32)).exp()
    return w.clamp(max=cap) if cap is not None else w


def sampling_mismatch_metrics(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor,
                              cap: float | None = None) -> dict[str, float]:
    """TRL's train-inference mismatch metrics over the tokens selected by ``mask``.

    * ``sampling/sampling_logp_difference/mean|max``: ``|log alpha_trainer - log alpha_engine|`` per token;
    * ``sampling/importance_sampling_ratio/min|mean|max``: the per-token weight of
      :func:`truncated_importance_weights` (truncated at ``cap`` when the correction is on, as TRL logs it).

    Args:
        trainer_logp: ``[B, T]`` float, the trainer's log-probs under the sampler's weights.
        engine_logp: ``[B, T]`` float, the engine's log-probs.
        mask: ``[B, T]`` bool or 0/1, the completion tokens to include.
        cap: the truncation of the ratio, or None for the raw ratio.

    Returns:
        Dict of the five floats; the differences are 0 and the ratios 1 when the mask selects nothing.

    Raises:
        ValueError: on shape mismatch.

    Example:
        >>> m = sampling_mismatch_metrics(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]),
        ...                               torch.tensor([[1, 1]]))
        >>> round(m["sampling/sampling_logp_difference/mean"], 4), round(m["sampling/importance_sampling_ratio/max"], 4)
        (0.25, 1.6487)
    """
    _check(trainer_logp, engine_logp, mask)
    m = mask.bool()
    delta = (trainer_logp.detach().float() - engine_logp.detach().float()).abs()[m]
    ratio = truncated_importance_weights(trainer_logp, engine_logp, cap)[m]
    if not delta.numel():
        return {"sampling/sampling_logp_difference/mean": 0.0, "sampling/sampling_logp_difference/max": 0.0,
                "sampling/importance_sampling_ratio/min": 1.0, "sampling/importance_sampling_ratio/mean": 1.0,
                "sampling/importance_sampling_ratio/max": 1.0}
    return {
        "sampling/sampling_logp_difference/mean": float(delta.mean()),
        "sampling/sampling_logp_difference/max": float(delta.max()),
        "sampling/importance_sampling_ratio/min": float(ratio.min()),
        "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
        "sampling/importance_sampling_ratio/max": float(ratio.max()),
    }


def first_use_mismatch(mb: Any, current: Tensor, step: int, cfg: Any) -> dict[str, float]:
    """Engine vs trainer log-probs of the SAME weights on the first use of a minibatch (TRL's ``sampling/*``).

    The trainer's side is the recomputed ``log alpha`` when there is one, else the current log-probs ``current``
    when the policy still holds the sampler's weights (lag 0); at lag > 0 without a recompute the two would mix the
    mismatch with staleness, so the values are NaN (Lightning would otherwise repeat the last ones).

    Args:
        mb: the :class:`~grpolab.rollout.buffer.Minibatch` trained at optimizer step ``step``.
        current: ``[B, T]`` the policy's log-probs of its completions at this step.
        cfg: the algorithm settings (``vllm_importance_sampling_correction``, ``vllm_importance_sampling_cap``).

    Returns:
        :func:`sampling_mismatch_metrics`' five floats; empty when the engine reports no log-probs.
    """
    if mb.engine_logp is None:
        return {}
    if mb.iteration == 0 and mb.sampler_logp is not None and not mb.sampler_logp_from_engine:
        trainer = mb.sampler_logp
    elif mb.iteration == 0 and mb.policy_version == step:
        trainer = current
    else:
        return dict.fromkeys(sampling_mismatch_metrics(current[:0], current[:0], current[:0]), math.nan)
    cap = cfg.vllm_importance_sampling_cap if cfg.vllm_importance_sampling_correction else None
    return sampling_mismatch_metrics(trainer.to(current.device), mb.engine_logp.to(current.device),
                                     mb.completion_mask.to(current.device), cap)
