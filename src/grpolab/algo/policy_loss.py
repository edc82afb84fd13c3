"""Policy-loss variants (``algo.clip_mode``) in a registry: the per-token objective of GRPO.

A variant is one function ``(inputs, cfg) -> (per_token, stats)`` registered by name with
:func:`register_policy_loss`. It receives a :class:`PolicyLossInputs` (current ``log pi_theta``, sampler
``log alpha`` and anchor ``log pi_k`` log-probs, advantages, loss mask; masked positions already zeroed) and
the loss settings (a :class:`~grpolab.algo.loss_config.LossConfig`, e.g. the run's ``GRPOConfig``), and returns
the per-token loss to MINIMISE, ``[B, T]``, and its own statistics (what it clipped or masked).
:func:`~grpolab.algo.losses.grpo_loss` adds the KL term, the engine/trainer token weights and the aggregation
(``algo.loss_type``, :mod:`grpolab.algo.aggregation`) around it. ``anchor_logp`` is the policy at the first
use of the minibatch, frozen for its later ``num_iterations`` passes.

The built-in variants are the clipped surrogate ``-min(r * A, clip(r, lo, hi) * A)`` with the ratio of
:func:`importance_ratios` and two windows (Mroueh et al. 2025, arXiv 2505.22257, off-policy GRPO):
``ppo``: ``[1 - eps, 1 + eps_high]``; ``offpolicy_grpo``: ``[max(r' - eps, 0), r' + eps_high]`` centred on
``r' = pi_k / alpha``, with the optional truncated importance weight ``algo.importance_weight_cap``. With
``alpha == pi_k`` the two coincide; with ``sampler_logp = anchor_logp = logp.detach()`` (on-policy, one
iteration) the ratio is 1 and the gradient is REINFORCE with the group baseline.

Adding a variant (then ``algo.clip_mode=reinforce`` selects it)::

    @register_policy_loss("reinforce")
    def reinforce(inp: PolicyLossInputs, cfg) -> tuple[Tensor, dict[str, Tensor]]:
        return -inp.advantages * inp.logp, {}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpolab.errors import ConfigError

IS_LEVELS = ("token", "sequence", "sequence_sum")
RATIO_REFERENCES = ("sampler", "anchor", "previous")
HIGH_WEIGHT = 2.0  # importance weights above this count as "large" in the stats (grad_weight_high_sum, ...)


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a variant sees. Every tensor is 0 at the masked positions (padding garbage, -inf and NaN never
    reach a variant) and has the dtype of ``logp``.

    Attributes:
        logp: ``[B, T]`` float, ``log pi_theta`` of the completion tokens (requires grad).
        sampler_logp: ``[B, T]``, ``log alpha`` of the sampler, detached.
        anchor_logp: ``[B, T]``, ``log pi_k`` frozen at the first use of the minibatch, detached.
        advantages: ``[B, 1]``, one advantage per sequence, detached (broadcasts over tokens).
        mask: ``[B, T]`` bool, the loss mask.
        lag: optimizer steps between the sampler's weights and this step (0 on-policy; one value for the
            minibatch), for variants that weigh by staleness.
        previous_logp: ``[B, T]``, ``log pi_{t-1}`` of the policy before the last optimizer step, detached
            (``algo.ratio_reference=previous`` only; None otherwise).
    """

    logp: Tensor
    sampler_logp: Tensor
    anchor_logp: Tensor
    advantages: Tensor
    mask: Tensor
    lag: int = 0
    previous_logp: Tensor | None = None


PolicyLossFn = Callable[[PolicyLossInputs, Any], "tuple[Tensor, dict[str, Tensor]]"]


@dataclass(frozen=True)
class PolicyLoss:
    """One registered ``algo.clip_mode``.

    Attributes:
        name: the ``algo.clip_mode`` value.
        fn: ``(inputs, cfg) -> (per_token, stats)``: ``per_token`` ``[B, T]`` float (the loss to minimise,
            before KL, token weights and aggregation; masked positions are zeroed afterwards); ``stats`` a dict
            of detached 0-dim tensors that add up over micro-batches (keys ending in ``_min``/``_max`` are
            merged by min/max, see :func:`~grpolab.algo.losses.merge_loss_stats`).
        options: ``algo.<key>`` names, null by default, that only some variants read (``importance_weight_cap``);
            setting one for a variant that does not list it is an error.
        check: extra validation ``(cfg) -> None`` raising ``ValueError`` naming ``algo.<key>``, or None.
    """

    name: str
    fn: PolicyLossFn
    options: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, *, options: tuple[str, ...] = (),
                         check: Callable[[Any], None] | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a variant as ``algo.clip_mode=<name>`` (see :class:`PolicyLoss`).

    Raises:
        ValueError: if ``name`` is already registered.
    """
    if name in POLICY_LOSSES:
        raise ValueError(f"algo.clip_mode {name!r} is already registered")

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = PolicyLoss(name, fn, tuple(options), check)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered variant called ``name``.

    Raises:
        ValueError: naming ``algo.clip_mode`` and listing the registered names.
    """
    if name not in POLICY_LOSSES:
        raise ConfigError(f"algo.clip_mode must be one of {tuple(POLICY_LOSSES)}, got {name!r} (a variant of your "
                          "own is registered by importing its module: add imports=[<module>])")
    return POLICY_LOSSES[name]


# ------------------------------------------------------------------------------- importance ratios
def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``[B, T] -> [B]`` mean over the True entries of ``mask`` (0 for an empty row)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(1) / mask.sum(1).clamp(min=1).to(x.dtype)


def _seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``[B, T] -> [B]`` sum over the True entries of ``mask`` (0 for an empty row)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum(1)


@dataclass(frozen=True)
class Ratios:
    """Importance ratios at ``algo.importance_sampling_level``, each ``[B, T]`` of ``logp``'s dtype.

    Attributes:
        ratio: ``r = pi_theta / base`` (carries the gradient), ``base`` from ``algo.ratio_reference``.
        centre: ``pi_k / base`` (1 with the anchor as base; ``pi_k / pi_{t-1}`` with the previous policy,
            unused by ``ppo``'s window), detached.
        anchor_ratio: ``pi_k / alpha`` whatever the reference (for the statistics), detached.
    """

    ratio: Tensor
    centre: Tensor
    anchor_ratio: Tensor


def importance_ratios(inp: PolicyLossInputs, cfg: Any) -> Ratios:
    """The ratios of the clipped variants.

    ``base`` is ``sampler_logp`` (``ratio_reference="sampler"``: ``r = pi / alpha``), ``anchor_logp``
    (``"anchor"``: ``r = pi / pi_k``, 1 at first use, no correction for ``alpha != pi_k``: what TRL computes
    with a stale vLLM sampler and ``num_iterations = 1``) or ``previous_logp`` (``"previous"``: ``r = pi /
    pi_{t-1}``, the policy before the last optimizer step, also without correction for the sampler: at
    ``k = i = 1`` a PPO window around the previous step's policy on samples of the current one). Levels (``importance_sampling_level``): ``token``
    (one ratio per token, TRL's default); ``sequence`` (GSPO, Zheng et al. 2025: ``r_t = sg[s_i] *
    exp(logp_t - sg[logp_t])`` with ``s_i = exp(mean_t log r_t)`` over the loss tokens, so the gradient of
    ``r_t`` w.r.t. ``logp_t`` is ``s_i``); ``sequence_sum`` (the paper's ``pi(y|x) / alpha(y|x)``: ``r_t = s_i =
    exp(sum_t log r_t)`` on every token, with its own gradient). Three tokens at log-ratio 0.3 give 1.350
    (``sequence``) and 2.460 (``sequence_sum``).

    Args:
        inp: the variant's inputs.
        cfg: loss settings (``ratio_reference``, ``importance_sampling_level``).

    Returns:
        :class:`Ratios`.

    Raises:
        ValueError: ``ratio_reference="previous"`` without ``inp.previous_logp``.
    """
    mask = inp.mask
    if cfg.ratio_reference == "previous":
        if inp.previous_logp is None:
            raise ValueError("algo.ratio_reference=previous needs previous_logp (log pi_{t-1}), got None")
        base = inp.previous_logp
    else:
        base = inp.anchor_logp if cfg.ratio_reference == "anchor" else inp.sampler_logp
    log_r = inp.logp - base
    log_r_centre = inp.anchor_logp - base  # 0 with the anchor as base: the window is centred on 1
    log_r_anchor = inp.anchor_logp - inp.sampler_logp  # pi_k / alpha, for the stats
    if cfg.importance_sampling_level in ("sequence", "sequence_sum"):
        if cfg.importance_sampling_level == "sequence":  # GSPO's form: gradient s_i on every token
            agg = _seq_mean
            ratio = agg(log_r.detach(), mask).unsqueeze(1).exp() * (inp.logp - inp.logp.detach()).exp()
        else:  # the sequence ratio itself on every token: its gradient is the gradient of the value
            agg = _seq_sum
            ratio = agg(log_r, mask).unsqueeze(1).exp().expand_as(inp.logp)
        centre = agg(log_r_centre, mask).unsqueeze(1).exp().expand_as(inp.logp)
        anchor_ratio = agg(log_r_anchor, mask).unsqueeze(1).exp().expand_as(inp.logp)
    else:
        ratio = log_r.exp()
        centre = log_r_centre.exp()
        anchor_ratio = log_r_anchor.exp()
    return Ratios(ratio, centre, anchor_ratio)


# ------------------------------------------------------------------------------- clip windows
def _ppo_window(centre: Tensor, cfg: Any) -> tuple[Tensor, Tensor]:
    return torch.full_like(centre, 1.0 - cfg.epsilon), torch.full_like(centre, 1.0 + cfg.eps_high)


def _centred_window(centre: Tensor, cfg: Any) -> tuple[Tensor, Tensor]:
    return (centre - cfg.epsilon).clamp(min=0.0), centre + cfg.eps_high


_WINDOWS = {"ppo": _ppo_window, "offpolicy_grpo": _centred_window}


def clip_bounds(centre: Tensor, cfg: Any) -> tuple[Tensor, Tensor]:
    """The clip window ``(lo, hi)`` of the built-in clipped variants, same shape as ``centre``.

    ``ppo``: ``(1 - eps, 1 + eps_high)`` everywhere; ``offpolicy_grpo``: ``(max(r' - eps, 0), r' + eps_high)``
    with ``r' = centre = pi_k / alpha`` (Mroueh et al. 2025, off-policy clip).

    Raises:
        ValueError: for a ``cfg.clip_mode`` without a window.

    Example:
        >>> from grpolab.algo.loss_config import LossConfig
        >>> clip_bounds(torch.tensor([1.5, 0.1]), LossConfig(clip_mode="offpolicy_grpo"))
        (tensor([1.3000, 0.0000]), tensor([1.7000, 0.3000]))
    """
    if cfg.clip_mode not in _WINDOWS:
        raise ValueError(f"algo.clip_mode={cfg.clip_mode!r} has no clip window (windows: {tuple(_WINDOWS)})")
    return _WINDOWS[cfg.clip_mode](centre, cfg)


def clipped_surrogate(inp: PolicyLossInputs, rt: Ratios, lo: Tensor, hi: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's per-token ``-min(r * A, clip(r, lo, hi) * A)`` and its statistics (TRL's definitions).

    Args:
        inp: the variant's inputs (``advantages``, ``mask``).
        rt: the ratios; ``rt.ratio`` carries the gradient.
        lo: ``[B, T]`` lower end of the window.
        hi: ``[B, T]`` upper end.

    Returns:
        ``(per_token [B, T], stats)`` with the detached 0-dim sums ``ratio_sum``, ``ratio_min``, ``ratio_max``
        (+inf / -inf when there are no tokens), ``anchor_ratio_sum`` and ``anchor_ratio_max`` (``pi_k / alpha``
        at the ratio's level, whatever ``ratio_reference``; max 0 when empty), ``anchor_ratio_high_sum`` (tokens
        with ``pi_k / alpha > 2``), ``grad_weight_sum`` (``sum |A| r`` over tokens whose unclipped term is
        active, the size of each token's gradient coefficient w.r.t. ``log r``), ``grad_weight_high_sum`` (its
        part from tokens with ``r > 2``), ``clip_low_sum`` (``r < lo`` and ``A < 0``), ``clip_high_sum``
        (``r > hi`` and ``A > 0``), ``clip_region_sum`` (either).
    """
    ratio, adv, mask = rt.ratio, inp.advantages, inp.mask
    clipped = torch.clamp(ratio, min=lo, max=hi)
    per_token = -torch.min(ratio * adv, clipped * adv)
    with torch.no_grad():
        r = ratio.detach()
        anchor_ratio = rt.anchor_ratio
        zeros = torch.zeros_like(r)
        low = mask & (r < lo) & (adv < 0)
        high = mask & (r > hi) & (adv > 0)
        # |d per_token / d log r| = |A| * r where the unclipped term is the active one, else 0
        active = mask & (r * adv <= clipped.detach() * adv)
        grad_weight = torch.where(active, r * adv.abs(), zeros)
        inf = torch.tensor(math.inf, dtype=r.dtype, device=r.device)
        stats = {
            "ratio_sum": torch.where(mask, r, zeros).sum(),
            "ratio_min": torch.where(mask, r, inf).min() if r.numel() else inf,
            "ratio_max": torch.where(mask, r, -inf).max() if r.numel() else -inf,
            "anchor_ratio_sum": torch.where(mask, anchor_ratio, zeros).sum(),
            "anchor_ratio_max": torch.where(mask, anchor_ratio, zeros).max() if r.numel() else zeros.sum(),
            "anchor_ratio_high_sum": (mask & (anchor_ratio > HIGH_WEIGHT)).sum().to(r.dtype),
            "grad_weight_sum": grad_weight.sum(),
            "grad_weight_high_sum": torch.where(r > HIGH_WEIGHT, grad_weight, zeros).sum(),
            "clip_low_sum": low.sum().to(r.dtype),
            "clip_high_sum": high.sum().to(r.dtype),
            "clip_region_sum": (low | high).sum().to(r.dtype),
        }
    return per_token, stats


# ------------------------------------------------------------------------------- built-in variants
@register_policy_loss("ppo")
def ppo_clip(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clip: the ratio of :func:`importance_ratios` clipped to ``[1 - eps, 1 + eps_high]`` (TRL's
    ``_compute_loss``; DAPO's clip-higher with ``epsilon_high > epsilon``).

    Returns:
        ``(per_token [B, T], stats)`` of :func:`clipped_surrogate`.
    """
    rt = importance_ratios(inp, cfg)
    lo, hi = _ppo_window(rt.centre, cfg)
    return clipped_surrogate(inp, rt, lo, hi)


def _check_cap_reference(cfg: Any) -> None:
    if cfg.importance_weight_cap is not None and cfg.ratio_reference != "sampler":
        raise ConfigError(
            "algo.importance_weight_cap caps pi_k/alpha, the window centre of algo.clip_mode=offpolicy_grpo "
            f"with algo.ratio_reference=sampler; got algo.ratio_reference={cfg.ratio_reference!r}: set "
            "algo.importance_weight_cap=null or algo.ratio_reference=sampler"
        )


@register_policy_loss("offpolicy_grpo", options=("importance_weight_cap",), check=_check_cap_reference)
def offpolicy_grpo_clip(inp: PolicyLossInputs, cfg: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """The off-policy GRPO clip (Mroueh et al. 2025): the window ``[max(r' - eps, 0), r' + eps_high]`` centred
    on ``r' = pi_k / alpha`` at the ratio's level (``r' = 1`` with ``ratio_reference="anchor"``).

    Truncated importance weight (``importance_weight_cap = c``, with ``ratio_reference="sampler"``): the centre
    is capped to ``min(r', c)`` and the ratio scaled by the same detached factor ``s = min(1, c / r')``, so
    ``r -> s * r = min(r', c) * pi / pi_k`` and the window becomes ``[max(min(r', c) - eps, 0), min(r', c) +
    eps_high]``. At the first use of a minibatch (``pi = pi_k``) every token's weight, and its gradient
    coefficient, is ``min(pi_k / alpha, c)`` instead of the unbounded ``pi_k / alpha`` (truncated importance
    sampling, as IMPALA's rho-bar and Yao et al. 2025's TIS). At the sequence levels it caps ``s_i``.

    Returns:
        ``(per_token [B, T], stats)`` of :func:`clipped_surrogate`.
    """
    rt = importance_ratios(inp, cfg)
    if cfg.importance_weight_cap is not None:
        scale = (cfg.importance_weight_cap / rt.centre).clamp(max=1.0).detach()
        rt = Ratios(rt.ratio * scale, rt.centre * scale, rt.anchor_ratio)
    lo, hi = _centred_window(rt.centre, cfg)
    return clipped_surrogate(inp, rt, lo, hi)
