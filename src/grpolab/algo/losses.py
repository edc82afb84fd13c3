"""The GRPO loss of one micro-batch: a registered policy-loss variant, the KL term, and an aggregation.

:func:`grpo_loss` zeroes every masked position of its inputs, runs the variant selected by
``algo.clip_mode`` (:mod:`grpolab.algo.policy_loss`) for the per-token objective, adds ``beta`` times the KL
to the reference, multiplies by the engine/trainer token weights, and reduces with ``algo.loss_type``
(:mod:`grpolab.algo.aggregation`). The loss is a SUM over the micro-batch divided by a denominator computed
once for the whole optimizer step (:func:`~grpolab.algo.aggregation.loss_denominator`), so the summed
micro-batch losses do not depend on the split. The settings are a
:class:`~grpolab.algo.loss_config.LossConfig` (the run's ``GRPOConfig`` is one).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpolab.algo.aggregation import get_aggregation, loss_denominator
from grpolab.algo.kl import kl_penalty
from grpolab.algo.loss_config import LossConfig
from grpolab.algo.policy_loss import PolicyLossInputs, clip_bounds, get_policy_loss

# LossConfig, clip_bounds and loss_denominator are re-exported so the whole loss API is one import away.
__all__ = ["LossConfig", "clip_bounds", "grpo_loss", "loss_denominator", "loss_stats_to_metrics",
           "merge_loss_stats"]


def _check_shapes(logp, sampler_logp, anchor_logp, advantages, loss_mask, ref_logp, previous_logp=None) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}")
    named = {"sampler_logp": sampler_logp, "anchor_logp": anchor_logp, "loss_mask": loss_mask}
    if ref_logp is not None:
        named["ref_logp"] = ref_logp
    if previous_logp is not None:
        named["previous_logp"] = previous_logp
    for name, t in named.items():
        if t.shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}, got {tuple(t.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must have shape [B]={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}"
        )
    if not loss_mask.dtype == torch.bool and not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError("loss_mask must be bool or contain only 0/1 (weights are not supported)")


def grpo_loss(
    logp: Tensor,
    sampler_logp: Tensor,
    anchor_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cfg: LossConfig,
    denominator: float,
    ref_logp: Tensor | None = None,
    token_weights: Tensor | None = None,
    lag: int = 0,
    previous_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO loss of one micro-batch (to MINIMISE).

    Per token: ``(variant(logp, sampler_logp, anchor_logp, A) + beta * kl_penalty(logp, ref_logp)) * w`` with
    the variant of ``cfg.clip_mode`` (for the built-in ones ``-min(r * A, clip(r, lo, hi) * A)``, see
    :mod:`grpolab.algo.policy_loss`) and ``w`` the token weights (1 if None); then ``cfg.loss_type``'s
    reduction (``grpo`` sums each sequence's token mean, the others sum tokens) divided by ``denominator``.
    With ``importance_sampling_level="sequence_sum"`` and ``loss_type="grpo"`` the loss is exactly
    ``-mean_i f(s_i, s'_i, A_i)`` of the paper's off-policy objective; the token-sum types weight each sequence
    by its length. Masked positions are excluded with ``torch.where`` before the variant runs, so any value
    there (padding garbage, -inf, NaN) cannot reach the loss, the stats or the gradient. No clamp is applied
    to the ratio or the KL; an overflow shows up as a non-finite loss for the trainer's check.

    Args:
        logp: ``[B, T]`` float, current log-probs of the completion tokens (under the temperature).
        sampler_logp: ``[B, T]``, ``log alpha`` of the sampler, detached.
        anchor_logp: ``[B, T]``, ``log pi_k`` frozen at the start of the optimizer step, detached.
        advantages: ``[B]`` float, one advantage per sequence.
        loss_mask: ``[B, T]`` bool or 0/1, completion mask times the zero-std-group and truncation masks.
        cfg: :class:`~grpolab.algo.loss_config.LossConfig` (or the ``GRPOConfig`` built on it).
        denominator: from :func:`~grpolab.algo.aggregation.step_denominator` over the whole step batch, ``>= 0``.
        ref_logp: ``[B, T]`` reference log-probs; required when ``cfg.beta > 0``.
        token_weights: ``[B, T]`` detached per-token factors of the loss (KL term included), e.g. the
            truncated importance weights of the engine/trainer mismatch (TRL multiplies ``per_token_loss`` by
            them when ``vllm_importance_sampling_correction`` is on); None = 1.
        lag: the minibatch's staleness in optimizer steps (:attr:`PolicyLossInputs.lag`), 0 on-policy.
        previous_logp: ``[B, T]`` ``log pi_{t-1}``, the policy before the last optimizer step, detached; required
            by ``cfg.ratio_reference="previous"`` (:func:`~grpolab.previous_policy.PreviousPolicy`), else unused.

    Returns:
        ``(loss, stats)``: ``loss`` is a 0-dim tensor (this micro-batch's sum / ``denominator``);
        ``stats`` is a flat dict of detached 0-dim tensors that add up across micro-batches (see
        :func:`merge_loss_stats`): ``num_tokens``, ``num_sequences``, then the variant's own (for the built-in
        variants those of :func:`~grpolab.algo.policy_loss.clipped_surrogate`: ``ratio_*``, ``anchor_ratio_*``,
        ``grad_weight_*``, ``clip_*``), then ``kl_sum`` (only when ``ref_logp`` is given).

    Raises:
        ValueError: on shape mismatch, ``beta > 0`` without ``ref_logp``, ``ratio_reference="previous"``
            without ``previous_logp``, a negative or non-finite
            denominator, a zero denominator while this micro-batch has loss tokens, an unknown
            ``clip_mode``/``loss_type``, or variant stats that reuse a key of the generic ones.
    """
    _check_shapes(logp, sampler_logp, anchor_logp, advantages, loss_mask, ref_logp, previous_logp)
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError("ref_logp is required when algo.beta > 0")
    if cfg.ratio_reference == "previous" and previous_logp is None:
        raise ValueError("previous_logp (log pi_{t-1}) is required when algo.ratio_reference=previous")
    if not (math.isfinite(denominator) and denominator >= 0):
        raise ValueError(f"denominator must be finite and >= 0, got {denominator}")
    variant, aggregation = get_policy_loss(cfg.clip_mode), get_aggregation(cfg.loss_type)
    mask = loss_mask.bool()
    if denominator == 0:
        if bool(mask.any()):
            raise ValueError("denominator is 0 but loss_mask has loss tokens; compute it over the step batch")
        denominator = 1.0  # every token is masked: the loss is an exact 0 with zero gradients

    # Replace every masked position by 0 first: whatever is there (padding, -inf, NaN) then cannot reach
    # the loss, the stats or the gradient (where's backward sends exactly 0 to masked positions of logp).
    zeros = torch.zeros_like(logp).detach()
    logp = torch.where(mask, logp, zeros)
    inputs = PolicyLossInputs(
        logp=logp,
        sampler_logp=torch.where(mask, sampler_logp.detach().to(logp.dtype), zeros),
        anchor_logp=torch.where(mask, anchor_logp.detach().to(logp.dtype), zeros),
        advantages=advantages.detach().to(logp.dtype).unsqueeze(1),
        mask=mask,
        lag=int(lag),
        previous_logp=None if previous_logp is None else torch.where(mask, previous_logp.detach().to(logp.dtype), zeros),
    )
    per_token, variant_stats = variant.fn(inputs, cfg)
    kl = None
    if ref_logp is not None:
        ref_safe = torch.where(mask, ref_logp.detach().to(logp.dtype), zeros)
        kl = torch.where(mask, kl_penalty(logp, ref_safe, cfg.kl_estimator), zeros)
        if cfg.beta > 0:
            per_token = per_token + cfg.beta * kl
    if token_weights is not None:
        if token_weights.shape != logp.shape:
            raise ValueError(f"token_weights must have the shape of logp {tuple(logp.shape)}, "
                             f"got {tuple(token_weights.shape)}")
        per_token = per_token * torch.where(mask, token_weights.detach().to(logp.dtype), zeros)
    per_token = torch.where(mask, per_token, zeros)
    loss = aggregation.reduce(per_token, mask) / denominator

    with torch.no_grad():
        stats = {"num_tokens": mask.sum().to(logp.dtype), "num_sequences": mask.any(1).sum().to(logp.dtype)}
        if clash := (stats.keys() | {"kl_sum"}) & variant_stats.keys():
            raise ValueError(f"algo.clip_mode={cfg.clip_mode!r} returned stats named like generic ones: {sorted(clash)}")
        stats.update(variant_stats)
        if kl is not None:
            stats["kl_sum"] = kl.detach().sum()
    return loss, stats


def merge_loss_stats(stats: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Combine the ``stats`` of several micro-batches (min of ``*_min``, max of ``*_max``, sum otherwise).

    Raises:
        ValueError: if the list is empty or the dicts have different keys.
    """
    if not stats or any(s.keys() != stats[0].keys() for s in stats):
        raise ValueError("merge_loss_stats needs a non-empty list of dicts with the same keys")
    out = {}
    for key in stats[0]:
        vals = torch.stack([s[key] for s in stats])
        out[key] = vals.min() if key.endswith("_min") else vals.max() if key.endswith("_max") else vals.sum()
    return out


_NAMED_STATS = frozenset({
    "num_tokens", "num_sequences", "kl_sum", "ratio_sum", "ratio_min", "ratio_max", "anchor_ratio_sum",
    "anchor_ratio_max", "anchor_ratio_high_sum", "grad_weight_sum", "grad_weight_high_sum", "clip_low_sum",
    "clip_high_sum", "clip_region_sum",
})


def loss_stats_to_metrics(stats: dict[str, Tensor]) -> dict[str, float]:
    """Turn (merged) sums into TRL-named means.

    From the clipped variants' stats: ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
    ``clip_ratio/region_mean``, ``ratio/mean``, ``ratio/min``, ``ratio/max``, ``ratio/anchor_mean``,
    ``ratio/anchor_max``, ``ratio/anchor_frac_above_2`` (share of loss tokens with ``pi_k / alpha > 2``),
    ``ratio/grad_weight_frac_above_2`` (share of the loss-gradient weight ``sum |A| r`` over active tokens that
    tokens with ``r > 2`` carry; 0 when no token is active); always ``num_loss_tokens``; ``kl`` if present.
    Means are 0 and min/max are 1 when there are no tokens. Any other stat of a variant is logged under its
    own name: ``<x>_sum`` as ``<x>_mean`` (per loss token), ``<x>_min``/``<x>_max`` as they are (NaN when
    there are no tokens), anything else as its sum.

    Args:
        stats: :func:`merge_loss_stats` of :func:`grpo_loss`'s stats (``num_tokens`` required).

    Returns:
        ``{metric name: float}``.
    """
    n = float(stats["num_tokens"])
    div = max(n, 1.0)
    out = {}
    if "ratio_sum" in stats:
        out.update({
            "clip_ratio/low_mean": float(stats["clip_low_sum"]) / div,
            "clip_ratio/high_mean": float(stats["clip_high_sum"]) / div,
            "clip_ratio/region_mean": float(stats["clip_region_sum"]) / div,
            "ratio/mean": float(stats["ratio_sum"]) / div if n else 1.0,
            "ratio/min": float(stats["ratio_min"]) if n else 1.0,
            "ratio/max": float(stats["ratio_max"]) if n else 1.0,
            "ratio/anchor_mean": float(stats["anchor_ratio_sum"]) / div if n else 1.0,
        })
    out["num_loss_tokens"] = n
    if "anchor_ratio_max" in stats:
        gw = float(stats["grad_weight_sum"])
        out["ratio/anchor_max"] = float(stats["anchor_ratio_max"]) if n else 1.0
        out["ratio/anchor_frac_above_2"] = float(stats["anchor_ratio_high_sum"]) / div
        out["ratio/grad_weight_frac_above_2"] = float(stats["grad_weight_high_sum"]) / gw if gw > 0 else 0.0
    if "kl_sum" in stats:
        out["kl"] = float(stats["kl_sum"]) / div
    for key, value in stats.items():
        if key in _NAMED_STATS:
            continue
        if key.endswith("_sum"):
            out[f"{key[:-4]}_mean"] = float(value) / div
        elif key.endswith(("_min", "_max")):
            out[key] = float(value) if n else math.nan
        else:
            out[key] = float(value)
    return out
