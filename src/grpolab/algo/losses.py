"""The clipped GRPO surrogate, on- and off-policy (paper.md §1.3, §2.2; TRL's ``_compute_loss``).

Three log-prob tensors enter the loss:

* ``logp``: the policy being trained, ``log pi_theta`` (requires grad);
* ``sampler_logp``: ``log alpha``, the behaviour policy that sampled the tokens (stored in the buffer);
* ``anchor_logp``: ``log pi_k``, the policy at the start of this optimizer step (the first time this
  minibatch is used), frozen for the following ``num_iterations`` passes (pitfalls.md #9).

``ratio_reference="sampler"`` (default) takes the ratio against the sampler, ``r = pi_theta / alpha``:
``clip_mode="ppo"`` clips it to ``[1 - eps, 1 + eps_high]``; ``clip_mode="offpolicy_grpo"`` clips it to
``[max(r' - eps, 0), r' + eps_high]`` with ``r' = pi_k / alpha`` (paper.md §2.2). With ``alpha == pi_k`` the
two coincide. ``ratio_reference="anchor"`` takes it against the anchor, ``r = pi_theta / pi_k``, clipped to
``[1 - eps, 1 + eps_high]`` whatever ``clip_mode`` (the window centre ``pi_k / pi_k`` is 1): no correction for
``alpha != pi_k``, which is what TRL computes with a stale vLLM sampler and ``num_iterations = 1`` (every
first-use ratio is 1; paper.md §2.6, where the paper's own choice is UNVERIFIED). For on-policy TRL
behaviour (k = 1, one iteration) pass ``sampler_logp = anchor_logp = logp.detach()``: the ratio is 1 and the
gradient is REINFORCE with the group baseline.

Ratio levels (``importance_sampling_level``): ``token`` (one ratio per token, TRL's default); ``sequence``
(GSPO, Zheng et al. 2025: ``exp(mean_t log r_t)``, the length-normalised geometric mean); ``sequence_sum``
(the paper's ``pi(y|x) / alpha(y|x) = exp(sum_t log r_t)``, paper.md §2.1-§2.2). Three tokens at log-ratio
0.3 give 1.350 (``sequence``) and 2.460 (``sequence_sum``).

Truncated importance weight (``importance_weight_cap = c``, ``clip_mode="offpolicy_grpo"`` with
``ratio_reference="sampler"`` only): the centre ``r' = pi_k / alpha`` is capped to ``min(r', c)`` and the ratio
is scaled by the same detached factor ``s = min(1, c / r')``, so ``r -> s * r = min(r', c) * pi / pi_k`` and the
window becomes ``[max(min(r', c) - eps, 0), min(r', c) + eps_high]``. At the first use of a minibatch
(``pi = pi_k``) every token's weight, and its gradient coefficient, is ``min(pi_k / alpha, c)`` instead of the
unbounded ``pi_k / alpha`` (truncated importance sampling, as in IMPALA's rho-bar and Yao et al. 2025's TIS).
At the sequence levels the cap applies to the sequence ratio ``s_i``.

The loss is a SUM over the micro-batch divided by a denominator computed once for the whole optimizer
step (:func:`loss_denominator`), so the summed micro-batch losses do not depend on the split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpolab.algo.kl import KL_ESTIMATORS, kl_penalty

CLIP_MODES = ("ppo", "offpolicy_grpo")
IS_LEVELS = ("token", "sequence", "sequence_sum")
HIGH_WEIGHT = 2.0  # importance weights above this count as "large" in the stats (grad_weight_high_sum, ...)
RATIO_REFERENCES = ("sampler", "anchor")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class LossConfig:
    """Objective knobs (config group ``algo``); ``__post_init__`` validates every field.

    Attributes:
        epsilon: lower clip half-width, ``> 0`` (TRL's ``epsilon``, default 0.2).
        epsilon_high: upper clip half-width ``>= 0``; ``None`` means ``epsilon`` (symmetric).
        clip_mode: ``"ppo"`` (window around 1) or ``"offpolicy_grpo"`` (window around ``pi_k / alpha``).
        importance_sampling_level: ``"token"``, ``"sequence"`` (GSPO: ``exp`` of the MEAN token log-ratio)
            or ``"sequence_sum"`` (the paper's ``pi(y|x)/alpha(y|x)``: ``exp`` of the SUM).
        ratio_reference: ``"sampler"`` (``pi / alpha``, window from ``clip_mode``) or ``"anchor"``
            (``pi / pi_k``, window ``[1 - eps, 1 + eps_high]``).
        beta: weight ``>= 0`` of the KL to the reference; 0 means no reference is needed.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"`` (see :func:`loss_denominator`).
        max_completion_length: the constant ``L_max`` of ``dr_grpo`` (required for it), ``> 0``.
        importance_weight_cap: ``None`` or a finite ``c >= 1``: caps the centre ``pi_k / alpha`` (and scales the
            ratio alike) to ``c``; only with ``clip_mode="offpolicy_grpo"`` and ``ratio_reference="sampler"``.

    Raises:
        ValueError: naming ``algo.<field>`` for any invalid value.
    """

    epsilon: float = 0.2
    epsilon_high: float | None = None
    clip_mode: str = "ppo"
    importance_sampling_level: str = "token"
    beta: float = 0.0
    kl_estimator: str = "k3"
    loss_type: str = "bnpo"
    max_completion_length: int | None = None
    ratio_reference: str = "sampler"
    importance_weight_cap: float | None = None

    def __post_init__(self) -> None:
        if not (_is_number(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"algo.epsilon must be a finite number > 0, got {self.epsilon!r}")
        if self.epsilon_high is not None and not (_is_number(self.epsilon_high) and self.epsilon_high >= 0):
            raise ValueError(
                f"algo.epsilon_high must be null or a finite number >= 0, got {self.epsilon_high!r}"
            )
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"algo.clip_mode must be one of {CLIP_MODES}, got {self.clip_mode!r}")
        if self.importance_sampling_level not in IS_LEVELS:
            raise ValueError(
                f"algo.importance_sampling_level must be one of {IS_LEVELS}, got {self.importance_sampling_level!r}"
            )
        if self.ratio_reference not in RATIO_REFERENCES:
            raise ValueError(f"algo.ratio_reference must be one of {RATIO_REFERENCES}, got {self.ratio_reference!r}")
        if not (_is_number(self.beta) and self.beta >= 0):
            raise ValueError(f"algo.beta must be a finite number >= 0, got {self.beta!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"algo.kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"algo.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        mcl = self.max_completion_length
        if mcl is not None and not (isinstance(mcl, int) and not isinstance(mcl, bool) and mcl > 0):
            raise ValueError(f"algo.max_completion_length must be null or an int > 0, got {mcl!r}")
        if self.loss_type == "dr_grpo" and mcl is None:
            raise ValueError("algo.max_completion_length must be set when algo.loss_type is 'dr_grpo'")
        cap = self.importance_weight_cap
        if cap is not None:
            if not (_is_number(cap) and cap >= 1):
                raise ValueError(f"algo.importance_weight_cap must be null or a finite number >= 1, got {cap!r}")
            if self.clip_mode != "offpolicy_grpo" or self.ratio_reference != "sampler":
                raise ValueError(
                    "algo.importance_weight_cap caps pi_k/alpha, the window centre of algo.clip_mode=offpolicy_grpo "
                    "with algo.ratio_reference=sampler; got clip_mode="
                    f"{self.clip_mode!r}, ratio_reference={self.ratio_reference!r} (set it to null)"
                )

    @property
    def eps_high(self) -> float:
        """The upper clip half-width actually used (``epsilon_high`` or, if null, ``epsilon``)."""
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)


def loss_denominator(loss_mask: Tensor, loss_type: str, max_completion_length: int | None = None) -> float:
    """Normaliser of the loss, computed ONCE over the whole optimizer-step batch (all micro-batches).

    * ``grpo``: number of sequences with at least one loss token (each contributes its own token mean);
    * ``bnpo``: number of loss tokens of the step batch on this rank;
    * ``dapo``: number of loss tokens; the caller sums it across ranks (and divides by the world size
      when DDP averages gradients), as TRL's ``num_items_in_batch / num_processes``;
    * ``dr_grpo``: ``B * max_completion_length`` with ``B`` = ALL sequences of the step batch, masked ones
      included (Dr. GRPO's constant normaliser).

    Padding never enters it. A result of 0 means every completion is masked; :func:`grpo_loss` then
    returns 0 with zero gradients (pitfalls.md #4).

    Args:
        loss_mask: ``[B, T]`` bool or 0/1, the final loss mask of the whole step batch.
        loss_type: one of ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``.
        max_completion_length: required for ``dr_grpo``.

    Returns:
        The denominator as a Python float (one host sync).

    Raises:
        ValueError: unknown ``loss_type``, a non-2-D mask, or missing ``max_completion_length``.

    Example:
        >>> m = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
        >>> [loss_denominator(m, t, 4) for t in ("grpo", "bnpo", "dr_grpo")]
        [2.0, 3.0, 12.0]
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"algo.loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must have shape [B, T], got {tuple(loss_mask.shape)}")
    m = loss_mask.bool()
    if loss_type == "grpo":
        return float(m.any(dim=1).sum().item())
    if loss_type == "dr_grpo":
        if max_completion_length is None or max_completion_length <= 0:
            raise ValueError("algo.max_completion_length must be an int > 0 when algo.loss_type is 'dr_grpo'")
        return float(m.shape[0] * max_completion_length)
    return float(m.sum().item())


def clip_bounds(anchor_ratio: Tensor, cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """The clip window ``(lo, hi)`` for each token, same shape as ``anchor_ratio``.

    ``ppo``: ``(1 - eps, 1 + eps_high)`` everywhere; ``offpolicy_grpo``:
    ``(max(r' - eps, 0), r' + eps_high)`` with ``r' = anchor_ratio = pi_k / alpha`` (paper.md §2.2).

    Example:
        >>> cfg = LossConfig(clip_mode="offpolicy_grpo")
        >>> clip_bounds(torch.tensor([1.5, 0.1]), cfg)
        (tensor([1.3000, 0.0000]), tensor([1.7000, 0.3000]))
    """
    if cfg.clip_mode == "ppo":
        return (
            torch.full_like(anchor_ratio, 1.0 - cfg.epsilon),
            torch.full_like(anchor_ratio, 1.0 + cfg.eps_high),
        )
    return (anchor_ratio - cfg.epsilon).clamp(min=0.0), anchor_ratio + cfg.eps_high


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``[B, T] -> [B]`` mean over the True entries of ``mask`` (0 for an empty row)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(1) / mask.sum(1).clamp(min=1).to(x.dtype)


def _seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``[B, T] -> [B]`` sum over the True entries of ``mask`` (0 for an empty row)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(1)


def _check_shapes(logp, sampler_logp, anchor_logp, advantages, loss_mask, ref_logp) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}")
    named = {"sampler_logp": sampler_logp, "anchor_logp": anchor_logp, "loss_mask": loss_mask}
    if ref_logp is not None:
        named["ref_logp"] = ref_logp
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped importance-sampled GRPO loss of one micro-batch (to MINIMISE).

    Per token: ``-min(r * A, clip(r, lo, hi) * A) + beta * kl_penalty(logp, ref_logp)``, with
    ``r = exp(logp - base)`` (token level) or, at the sequence levels, ``r_t = sg[s_i] * exp(logp_t -
    sg[logp_t])`` with ``s_i = exp(mean_t(logp - base))`` over the loss tokens of sequence ``i``
    (``sequence``, GSPO; the gradient of ``r_t`` w.r.t. ``logp_t`` is ``s_i``), or ``r_t = s_i =
    exp(sum_t(logp - base))`` on every loss token (``sequence_sum``, the paper's pi(y|x)/alpha(y|x), with its
    own gradient; with ``loss_type="grpo"`` the loss is exactly ``-mean_i f(s_i, s'_i, A_i)`` of paper.md
    §2.2; the token-sum types weight each sequence by its length). ``base`` is ``sampler_logp`` (``ratio_reference=
    "sampler"``) or ``anchor_logp`` (``"anchor"``). The window ``[lo, hi]`` is ``[1 - eps, 1 + eps_high]``
    (``ppo``) or ``[max(r' - eps, 0), r' + eps_high]`` with ``r' = exp(anchor_logp - base)`` at the same
    level (``offpolicy_grpo``; ``r' = 1`` with the anchor as base).
    Aggregation: ``grpo`` sums each sequence's token mean; the other types sum tokens; both are then
    divided by ``denominator``. Masked positions are excluded with ``torch.where``, so any value there
    (padding garbage, -inf, NaN) cannot reach the loss, the stats or the gradient. No clamp is applied
    to the ratio or the KL; an overflow shows up as a non-finite loss for the trainer's check.

    Args:
        logp: ``[B, T]`` float, current log-probs of the completion tokens (under the temperature).
        sampler_logp: ``[B, T]``, ``log alpha`` of the sampler, detached.
        anchor_logp: ``[B, T]``, ``log pi_k`` frozen at the start of the optimizer step, detached.
        advantages: ``[B]`` float, one advantage per sequence.
        loss_mask: ``[B, T]`` bool or 0/1, completion mask times the zero-std-group and truncation masks.
        cfg: :class:`LossConfig`.
        denominator: from :func:`loss_denominator` over the whole step batch, ``>= 0``.
        ref_logp: ``[B, T]`` reference log-probs; required when ``cfg.beta > 0``.
        token_weights: ``[B, T]`` detached per-token factors of the loss (KL term included), e.g. the
            truncated importance weights of the engine/trainer mismatch (TRL multiplies ``per_token_loss`` by
            them when ``vllm_importance_sampling_correction`` is on); None = 1.

    Returns:
        ``(loss, stats)``: ``loss`` is a 0-dim tensor (this micro-batch's sum / ``denominator``);
        ``stats`` is a flat dict of detached 0-dim tensors that add up across micro-batches (see
        :func:`merge_loss_stats`): ``num_tokens``, ``num_sequences``, ``ratio_sum``, ``ratio_min``,
        ``ratio_max`` (+inf / -inf when there are no tokens), ``anchor_ratio_sum`` (sum of ``pi_k / alpha``
        at the ratio's level, whatever ``ratio_reference``),
        ``clip_low_sum`` (``r < lo`` and ``A < 0``), ``clip_high_sum`` (``r > hi`` and ``A > 0``),
        ``clip_region_sum`` (either; TRL's definitions), ``kl_sum`` (only when ``ref_logp`` is given).

    Raises:
        ValueError: on shape mismatch, ``beta > 0`` without ``ref_logp``, a negative or non-finite
            denominator, or a zero denominator while this micro-batch has loss tokens.
    """
    _check_shapes(logp, sampler_logp, anchor_logp, advantages, loss_mask, ref_logp)
    if cfg.beta > 0 and ref_logp is None:
        raise ValueError("ref_logp is required when algo.beta > 0")
    if not (math.isfinite(denominator) and denominator >= 0):
        raise ValueError(f"denominator must be finite and >= 0, got {denominator}")
    mask = loss_mask.bool()
    if denominator == 0:
        if bool(mask.any()):
            raise ValueError("denominator is 0 but loss_mask has loss tokens; compute it over the step batch")
        denominator = 1.0  # every token is masked: the loss is an exact 0 with zero gradients

    # Replace every masked position by 0 first: whatever is there (padding, -inf, NaN) then cannot reach
    # the loss, the stats or the gradient (where's backward sends exactly 0 to masked positions of logp).
    zeros = torch.zeros_like(logp).detach()
    logp = torch.where(mask, logp, zeros)
    sampler_logp = torch.where(mask, sampler_logp.detach().to(logp.dtype), zeros)
    anchor_logp = torch.where(mask, anchor_logp.detach().to(logp.dtype), zeros)
    base = anchor_logp if cfg.ratio_reference == "anchor" else sampler_logp
    log_r = logp - base
    log_r_centre = anchor_logp - base  # 0 with the anchor as base: the window is centred on 1
    log_r_anchor = anchor_logp - sampler_logp  # pi_k / alpha, for the stats
    if cfg.importance_sampling_level in ("sequence", "sequence_sum"):
        if cfg.importance_sampling_level == "sequence":  # GSPO's form: gradient s_i on every token
            agg = _seq_mean
            ratio = agg(log_r.detach(), mask).unsqueeze(1).exp() * (logp - logp.detach()).exp()
        else:  # the sequence ratio itself on every token: its gradient is the gradient of the value
            agg = _seq_sum
            ratio = agg(log_r, mask).unsqueeze(1).exp().expand_as(logp)
        centre = agg(log_r_centre, mask).unsqueeze(1).exp().expand_as(logp)
        anchor_ratio = agg(log_r_anchor, mask).unsqueeze(1).exp().expand_as(logp)
    else:
        ratio = log_r.exp()
        centre = log_r_centre.exp()
        anchor_ratio = log_r_anchor.exp()
    if cfg.importance_weight_cap is not None:  # truncated IS: centre min(r', c), ratio scaled by the same factor
        scale = (cfg.importance_weight_cap / centre).clamp(max=1.0).detach()
        ratio, centre = ratio * scale, centre * scale

    lo, hi = clip_bounds(centre, cfg)
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)
    clipped = torch.clamp(ratio, min=lo, max=hi)
    per_token = -torch.min(ratio * adv, clipped * adv)
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

    if cfg.loss_type == "grpo":
        total = (per_token.sum(1) / mask.sum(1).clamp(min=1).to(logp.dtype)).sum()
    else:
        total = per_token.sum()
    loss = total / denominator

    with torch.no_grad():
        r = ratio.detach()
        low = mask & (r < lo) & (adv < 0)
        high = mask & (r > hi) & (adv > 0)
        # |d per_token / d log r| = |A| * r where the unclipped term is the active one, else 0
        active = mask & (r * adv <= clipped.detach() * adv)
        grad_weight = torch.where(active, r * adv.abs(), zeros)
        inf = torch.tensor(math.inf, dtype=r.dtype, device=r.device)
        stats = {
            "num_tokens": mask.sum().to(r.dtype),
            "num_sequences": mask.any(1).sum().to(r.dtype),
            "ratio_sum": torch.where(mask, r, zeros).sum(),
            "ratio_min": torch.where(mask, r, inf).min() if r.numel() else inf,
            "ratio_max": torch.where(mask, r, -inf).max() if r.numel() else -inf,
            "anchor_ratio_sum": torch.where(mask, anchor_ratio, zeros).sum(),
            "anchor_ratio_max": torch.where(mask, anchor_ratio, zeros).max() if r.numel() else zeros.sum(),  # 0 if empty
            "anchor_ratio_high_sum": (mask & (anchor_ratio > HIGH_WEIGHT)).sum().to(r.dtype),
            "grad_weight_sum": grad_weight.sum(),
            "grad_weight_high_sum": torch.where(r > HIGH_WEIGHT, grad_weight, zeros).sum(),
            "clip_low_sum": low.sum().to(r.dtype),
            "clip_high_sum": high.sum().to(r.dtype),
            "clip_region_sum": (low | high).sum().to(r.dtype),
        }
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


def loss_stats_to_metrics(stats: dict[str, Tensor]) -> dict[str, float]:
    """Turn (merged) sums into TRL-named means: ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
    ``clip_ratio/region_mean``, ``ratio/mean``, ``ratio/min``, ``ratio/max``, ``ratio/anchor_mean``,
    ``ratio/anchor_max``, ``ratio/anchor_frac_above_2`` (share of loss tokens with ``pi_k / alpha > 2``),
    ``ratio/grad_weight_frac_above_2`` (share of the loss-gradient weight ``sum |A| r`` over active tokens that
    tokens with ``r > 2`` carry; 0 when no token is active), ``kl`` (if present) and ``num_loss_tokens``. Means are 0 and min/max are 1 when there are no tokens.
    """
    n = float(stats["num_tokens"])
    div = max(n, 1.0)
    out = {
        "clip_ratio/low_mean": float(stats["clip_low_sum"]) / div,
        "clip_ratio/high_mean": float(stats["clip_high_sum"]) / div,
        "clip_ratio/region_mean": float(stats["clip_region_sum"]) / div,
        "ratio/mean": float(stats["ratio_sum"]) / div if n else 1.0,
        "ratio/min": float(stats["ratio_min"]) if n else 1.0,
        "ratio/max": float(stats["ratio_max"]) if n else 1.0,
        "ratio/anchor_mean": float(stats["anchor_ratio_sum"]) / div if n else 1.0,
        "num_loss_tokens": n,
    }
    if "anchor_ratio_max" in stats:
        gw = float(stats["grad_weight_sum"])
        out["ratio/anchor_max"] = float(stats["anchor_ratio_max"]) if n else 1.0
        out["ratio/anchor_frac_above_2"] = float(stats["anchor_ratio_high_sum"]) / div
        out["ratio/grad_weight_frac_above_2"] = float(stats["grad_weight_high_sum"]) / gw if gw > 0 else 0.0
    if "kl_sum" in stats:
        out["kl"] = float(stats["kl_sum"]) / div
    return out
