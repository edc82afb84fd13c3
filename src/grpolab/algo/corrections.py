"""Off-policy corrections from the field, as ``algo.clip_mode`` variants beside ``ppo`` and ``offpolicy_grpo``.

Notation (per completion token): ``pi`` the policy being trained (``logp``, carries the gradient), ``alpha``
the sampler (behaviour) policy that drew the token (``sampler_logp``), ``pi_k`` the policy at the first use
of the minibatch (``anchor_logp``: the policy at the start of the step when ``num_iterations = 1``), ``A`` the
group advantage. ``rho = pi_k / alpha`` is the staleness of the token (1 on-policy).

Four variants share one form, a PPO window around a proximal policy times a detached behaviour weight::

    per_token = -min(r * A, clip(r, 1 - eps, 1 + eps_high) * A) * w,     r = pi / pi_prox

* ``decoupled_ppo``: ``pi_prox = pi_k`` (``algo.proximal_policy`` null or ``anchor``) or AReaL's log-linear approximation
  (``loglinear``), ``w = pi_prox / alpha``, tokens with ``w > algo.behaviour_weight_cap`` dropped (``w = 0``).
  Hilton et al. 2022, "Batch size-invariance for policy optimization" (decoupled PPO); Fu et al. 2025, AReaL,
  ``ppo_actor_loss_fn`` (``behav_imp_weight_cap``) and ``docs/algorithms/prox_approx.md``.
* ``seq_is_mask``: ``pi_prox = pi_k``, ``w_i = s_i * 1[s_i <= high]`` with the sequence ratio
  ``s_i = exp(sum_t log rho_t)``, the same on every token of row ``i``. TRL's ``GRPOTrainer`` with
  ``vllm_importance_sampling_mode="sequence_mask"`` (cap 3.0 by default), where ``pi_k`` is TRL's recomputed
  old log-probs.
* ``geo_seq_mask``: ``pi_prox = pi_k``, ``w_i = 1[low <= g_i <= high]`` with the geometric mean
  ``g_i = exp(mean_t log rho_t)``: a rejection mask, no weight (SkyRL's geometric sequence mask, recommended
  band [0.99, 1.01]).
* ``token_is_mask``: ``pi_prox = pi_k``, ``w_t = rho_t * 1[low <= rho_t <= high]`` (IcePop, Ring-1T report,
  band [0.5, 5]; with ``low = 0`` it is masked importance sampling, MIS).

and one is a weighted REINFORCE:

* ``cispo``: ``per_token = -sg(clip(pi / alpha, 1 - eps, 1 + eps_high)) * A * log pi`` (MiniMax-M1, Chen et al.
  2025, CISPO): the clipped importance weight carries no gradient, so no token's gradient is ever zeroed;
  MiniMax-M1 set no lower bound (``algo.epsilon=1.0`` gives ``lo = 0``).

``algo.is_mask_low`` / ``algo.is_mask_high`` set the bands of the three mask variants; null takes the
published default above. Every variant reports ``is_masked_sum`` (loss tokens whose weight was zeroed; logged
as ``is_masked_mean``, the share of loss tokens) and ``is_weight_sum`` (logged as ``is_weight_mean``); the
windowed ones also report the clip statistics of :func:`~grpolab.algo.policy_loss.clipped_surrogate`, with
``ratio/*`` the ratio ``pi / pi_prox``. All are token-level objectives: they need
``algo.importance_sampling_level=token`` and set their own reference (``algo.ratio_reference`` stays
``sampler``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from grpolab.algo.policy_loss import (
    PolicyLossInputs,
    Ratios,
    _seq_mean,
    _seq_sum,
    clipped_surrogate,
    register_policy_loss,
)
from grpolab.errors import ConfigError

PROXIMAL_POLICIES = ("anchor", "loglinear")
# (low, high) published with each mask variant: TRL's sequence_mask cap, SkyRL's geometric band, IcePop's band
DEFAULT_BANDS = {"seq_is_mask": (0.0, 3.0), "geo_seq_mask": (0.99, 1.01), "token_is_mask": (0.5, 5.0)}


def _check_token_level(cfg: Any) -> None:
    if cfg.importance_sampling_level != "token":
        raise ConfigError(f"algo.clip_mode={cfg.clip_mode} is a token-level objective: set "
                         f"algo.importance_sampling_level=token (got {cfg.importance_sampling_level!r})")
    if cfg.ratio_reference != "sampler":
        raise ConfigError(f"algo.clip_mode={cfg.clip_mode} sets its own reference policy: leave "
                         f"algo.ratio_reference=sampler (got {cfg.ratio_reference!r})")


def _check_band(cfg: Any) -> None:
    _check_token_level(cfg)
    low, high = band(cfg)
    if not (0.0 <= low <= 1.0 <= high):
        raise ConfigError(f"algo.is_mask_low / algo.is_mask_high must satisfy 0 <= low <= 1 <= high for "
                         f"algo.clip_mode={cfg.clip_mode}, got [{low}, {high}]")


def _check_decoupled(cfg: Any) -> None:
    _check_token_level(cfg)
    if cfg.proximal_policy is not None and cfg.proximal_policy not in PROXIMAL_POLICIES:
        raise ConfigError(f"algo.proximal_policy must be one of {PROXIMAL_POLICIES}, got {cfg.proximal_policy!r}")


def band(cfg: Any) -> tuple[float, float]:
    """``(low, high)`` of a mask variant: ``algo.is_mask_low`` / ``algo.is_mask_high``, each null -> the
    variant's published default (:data:`DEFAULT_BANDS`)."""
    low, high = DEFAULT_BANDS[cfg.clip_mode]
    return (low if cfg.is_mask_low is None else float(cfg.is_mask_low),
            high if cfg.is_mask_high is None else float(cfg.is_mask_high))


def proximal_log_probs(inp: PolicyLossInputs, method: str) -> Tensor:
    """``log pi_prox`` ``[B, T]``, detached.

    ``anchor``: ``pi_k`` (exact: the policy at the first use of the minibatch). ``loglinear``: AReaL's
    version-weighted interpolation ``log alpha + a * (log pi - log alpha)`` with ``a = lag / (lag + 1)``, the
    share of the ``lag + 1`` policy versions between the sampler's and the one this step produces that lie
    before this step (``pi_prox = alpha`` at lag 0). Here ``pi_k`` costs no extra forward, so ``anchor`` is the
    default; ``loglinear`` is there to compare with AReaL.

    Raises:
        ValueError: for an unknown ``method``.
    """
    if method == "anchor":
        return inp.anchor_logp
    if method == "loglinear":
        a = inp.lag / (inp.lag + 1.0)
        return inp.sampler_logp + a * (inp.logp.detach() - inp.sampler_logp)
    raise ConfigError(f"algo.proximal_policy must be one of {PROXIMAL_POLICIES}, got {method!r}")


def behaviour_weighted_ppo(inp: PolicyLossInputs, cfg: Any, prox_logp: Tensor, weight: Tensor,
                           dropped: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """``-min(r A, clip(r, 1 - eps, 1 + eps_high) A) * w`` with ``r = pi / pi_prox`` (token level).

    Args:
        inp: the variant's inputs.
        cfg: loss settings (``epsilon``, ``eps_high``).
        prox_logp: ``[B, T]`` detached ``log pi_prox``.
        weight: ``[B, T]`` or ``[B, 1]`` detached behaviour weight ``w`` (already 0 where dropped).
        dropped: ``[B, T]`` or ``[B, 1]`` bool, where the weight was zeroed by a mask.

    Returns:
        ``(per_token [B, T], stats)``: :func:`~grpolab.algo.policy_loss.clipped_surrogate`'s statistics plus
        ``is_masked_sum`` and ``is_weight_sum`` over the loss tokens.
    """
    mask = inp.mask
    weight = weight.detach().expand_as(inp.logp)
    dropped = dropped.expand_as(mask) & mask
    ratio = (inp.logp - prox_logp).exp()
    anchor_ratio = (inp.anchor_logp - inp.sampler_logp).exp()
    rt = Ratios(ratio, torch.ones_like(ratio), anchor_ratio)
    lo = torch.full_like(ratio, 1.0 - cfg.epsilon)
    hi = torch.full_like(ratio, 1.0 + cfg.eps_high)
    per_token, stats = clipped_surrogate(inp, rt, lo, hi)
    zeros = torch.zeros_like(weight)
    stats["is_masked_sum"] = dropped.sum().to(inp.logp.dtype)
    stats["is_weight_sum"] = torch.where(mask, weight, zeros).sum()
    return per_token * weight, stats


@register_policy_loss("decoupled_ppo", options=("behaviour_weight_cap", "proximal_policy"), check=_check_decoupled)
def decoupled_ppo(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """Decoupled PPO: the window around ``pi_prox``, each token weighted by ``pi_prox / alpha``, tokens above
    ``algo.behaviour_weight_cap`` dropped (AReaL's ``behav_imp_weight_cap``; null = no cap). With
    ``pi_prox = pi_k`` the first-use weight equals the paper's ``pi_k / alpha`` and the window is
    ``[1 - eps, 1 + eps_high]`` in ``pi / pi_k``: at a minibatch's first use ``pi = pi_k`` in value, so the window
    cannot bind and the update is the paper's; it binds from the second update on (``num_iterations > 1``, as in
    AReaL, where several minibatch updates follow one proximal policy). ``loglinear`` puts ``pi_prox`` between
    ``alpha`` and ``pi``, so its window can bind at the first update (see the module docstring for the sources).

    Returns:
        ``(per_token [B, T], stats)`` of :func:`behaviour_weighted_ppo`.
    """
    prox = proximal_log_probs(inp, cfg.proximal_policy or "anchor")
    weight = (prox - inp.sampler_logp).exp()
    dropped = torch.zeros_like(inp.mask)
    if cfg.behaviour_weight_cap is not None:
        dropped = weight > cfg.behaviour_weight_cap
        weight = torch.where(dropped, torch.zeros_like(weight), weight)
    return behaviour_weighted_ppo(inp, cfg, prox, weight, dropped)


@register_policy_loss("seq_is_mask", options=("is_mask_high",), check=_check_band)
def seq_is_mask(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO window around ``pi_k``, each row weighted by its sequence ratio ``s_i = prod_t pi_k / alpha``,
    rows with ``s_i > algo.is_mask_high`` (default 3.0) dropped (TRL's ``sequence_mask``).

    Returns:
        ``(per_token [B, T], stats)`` of :func:`behaviour_weighted_ppo`.
    """
    _, high = band(cfg)
    s = _seq_sum(inp.anchor_logp - inp.sampler_logp, inp.mask).exp().unsqueeze(1)
    dropped = s > high
    return behaviour_weighted_ppo(inp, cfg, inp.anchor_logp, torch.where(dropped, torch.zeros_like(s), s), dropped)


@register_policy_loss("geo_seq_mask", options=("is_mask_low", "is_mask_high"), check=_check_band)
def geo_seq_mask(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO window around ``pi_k``; rows whose geometric-mean ratio ``exp(mean_t log pi_k / alpha)`` leaves
    ``[algo.is_mask_low, algo.is_mask_high]`` (default [0.99, 1.01]) are dropped, the others weigh 1 (SkyRL).

    Returns:
        ``(per_token [B, T], stats)`` of :func:`behaviour_weighted_ppo`.
    """
    low, high = band(cfg)
    g = _seq_mean(inp.anchor_logp - inp.sampler_logp, inp.mask).exp().unsqueeze(1)
    dropped = (g < low) | (g > high)
    weight = (~dropped).to(inp.logp.dtype)
    return behaviour_weighted_ppo(inp, cfg, inp.anchor_logp, weight, dropped)


@register_policy_loss("token_is_mask", options=("is_mask_low", "is_mask_high"), check=_check_band)
def token_is_mask(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO window around ``pi_k``, each token weighted by ``rho = pi_k / alpha``, tokens with ``rho`` outside
    ``[algo.is_mask_low, algo.is_mask_high]`` (default [0.5, 5]) dropped (IcePop; MIS with ``low = 0``).

    Returns:
        ``(per_token [B, T], stats)`` of :func:`behaviour_weighted_ppo`.
    """
    low, high = band(cfg)
    rho = (inp.anchor_logp - inp.sampler_logp).exp()
    dropped = (rho < low) | (rho > high)
    return behaviour_weighted_ppo(inp, cfg, inp.anchor_logp, torch.where(dropped, torch.zeros_like(rho), rho),
                                  dropped)


@register_policy_loss("cispo", check=_check_token_level)
def cispo(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1): ``-sg(clip(pi / alpha, 1 - eps, 1 + eps_high)) * A * log pi``. Every token keeps a
    gradient ``-clip(r) * A`` with respect to ``log pi``; the clip only bounds its size.

    Returns:
        ``(per_token [B, T], stats)``: ``ratio_sum``/``ratio_min``/``ratio_max`` (of ``pi / alpha``),
        ``clip_low_sum``/``clip_high_sum``/``clip_region_sum`` (tokens whose weight was clipped, whatever the
        sign of ``A``), ``is_masked_sum`` (0: CISPO drops no token) and ``is_weight_sum`` (the clipped weights).
    """
    mask = inp.mask
    r = (inp.logp - inp.sampler_logp).exp().detach()
    weight = r.clamp(min=1.0 - cfg.epsilon, max=1.0 + cfg.eps_high)
    per_token = -weight * inp.advantages * inp.logp
    with torch.no_grad():
        zeros = torch.zeros_like(r)
        inf = torch.tensor(float("inf"), dtype=r.dtype, device=r.device)
        low = mask & (r < 1.0 - cfg.epsilon)
        high = mask & (r > 1.0 + cfg.eps_high)
        stats = {
            "ratio_sum": torch.where(mask, r, zeros).sum(),
            "ratio_min": torch.where(mask, r, inf).min() if r.numel() else inf,
            "ratio_max": torch.where(mask, r, -inf).max() if r.numel() else -inf,
            "anchor_ratio_sum": torch.where(mask, (inp.anchor_logp - inp.sampler_logp).exp(), zeros).sum(),
            "clip_low_sum": low.sum().to(r.dtype),
            "clip_high_sum": high.sum().to(r.dtype),
            "clip_region_sum": (low | high).sum().to(r.dtype),
            "is_masked_sum": zeros.sum(),
            "is_weight_sum": torch.where(mask, weight, zeros).sum(),
        }
    return per_token, stats
