"""The effective sample size (ESS) of importance weights, normalised to (0, 1].

With importance weights ``w_j = pi(y_j) / alpha(y_j)`` of ``n`` samples drawn from the sampler alpha, the effective
sample size ``(sum_j w_j)^2 / sum_j w_j^2`` (Kish 1965, "Survey Sampling"; for importance weights Kong, Liu and Wong
1994, "Sequential imputations and Bayesian missing data problems", JASA 89, and Liu 1996, "Metropolized independent
sampling", Statistics and Computing 6) is about the number of equally weighted samples whose average has the variance
of the weighted one. Divided by ``n`` it lies in ``(0, 1]``: 1 when every weight is equal (the policy is the
sampler), ``1/n`` when one weight carries everything. Sequential Monte Carlo resamples when it falls below a
threshold; "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (arXiv 2602.17616) reports that it predicts
collapse under stale rollouts in LLM RL.

The value is invariant to scaling every weight by one constant, so the weights are taken relative to the largest
(``exp(log w - max log w)``, every term <= 1): a sequence's weight, a product over hundreds of tokens, overflows a
float64 otherwise. Over several processes each one computes :func:`ess_sums` with the same shift (the maximum over
every process) and the sums add up; :func:`normalized_ess` of the totals is the pooled batch's ESS.

Pure torch, no gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LEVELS = ("token", "sequence")


def log_importance_weights(log_ratio: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """The log importance weights of a minibatch, one per sample.

    Args:
        log_ratio: ``[B, T]`` float, ``log pi - log alpha`` per completion token (any value at padding).
        mask: ``[B, T]`` bool or 0/1, the completion tokens.
        level: ``"token"``: one sample per completion token, ``log w = log_ratio``; ``"sequence"``: one sample per
            completion with at least one token, ``log w = sum_t log_ratio_t``, the log of the completion's own weight
            ``pi(y|x) / alpha(y|x)``.

    Returns:
        ``[N]`` float64 (N = completion tokens, or completions with a token).

    Raises:
        ValueError: an unknown ``level``, or shapes that differ.

    Example:
        >>> lr = torch.tensor([[0.5, 0.25, 9.0], [0.125, 0.0, 0.0]])
        >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)  # 9.0 is padding
        >>> log_importance_weights(lr, m).tolist(), log_importance_weights(lr, m, "sequence").tolist()
        ([0.5, 0.25, 0.125], [0.75, 0.125])
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if log_ratio.shape != mask.shape:
        raise ValueError(f"log_ratio and mask must share a shape, got {tuple(log_ratio.shape)} and {tuple(mask.shape)}")
    m = mask.bool()
    lr = log_ratio.detach().to(torch.float64)
    if level == "token":
        return lr[m]
    return torch.where(m, lr, torch.zeros_like(lr)).sum(1)[m.any(1)]


def ess_sums(log_weights: Tensor, shift: float) -> dict[str, float]:
    """The sums the ESS is made of, with every weight divided by ``exp(shift)``: add them over processes.

    Args:
        log_weights: ``[N]`` float (:func:`log_importance_weights`).
        shift: a common log scale, at least every process's largest log weight (the maximum over processes); not
            finite (no weight anywhere): every sum is 0.

    Returns:
        ``{"sum_w": sum_j exp(lw_j - shift), "sum_w2": sum_j exp(2 (lw_j - shift)), "n": N}`` as Python floats.
    """
    n = float(log_weights.numel())
    if not n or not math.isfinite(shift):
        return {"sum_w": 0.0, "sum_w2": 0.0, "n": n}
    w = (log_weights.to(torch.float64) - shift).exp()
    return {"sum_w": float(w.sum()), "sum_w2": float((w * w).sum()), "n": n}


def normalized_ess(sum_w: float, sum_w2: float, n: float) -> float:
    """``ESS / n = (sum w)^2 / (n sum w^2)`` in (0, 1]; NaN when there is no sample (``n = 0`` or ``sum_w2 = 0``).

    Example:
        >>> normalized_ess(4.0, 4.0, 4)  # four equal weights
        1.0
        >>> normalized_ess(1.0, 1.0, 4)  # one weight carries everything
        0.25
    """
    if not n or not sum_w2 > 0:
        return math.nan
    return sum_w * sum_w / (n * sum_w2)


def effective_sample_size(log_ratio: Tensor, mask: Tensor, level: str = "token") -> float:
    """``ESS / n`` of the importance weights of one process's minibatch (:func:`log_importance_weights`, then
    :func:`ess_sums` shifted by the largest log weight, then :func:`normalized_ess`).

    Args:
        log_ratio: ``[B, T]`` float, ``log pi - log alpha`` per token.
        mask: ``[B, T]`` bool, the completion tokens.
        level: ``"token"`` or ``"sequence"``.

    Returns:
        A float in (0, 1]; NaN when the mask selects nothing.

    Example:
        >>> w = torch.tensor([[1.0, 1.0, 2.0, 4.0]])  # (8)^2 / (4 * 22) = 0.7272...
        >>> round(effective_sample_size(w.log(), torch.ones(1, 4, dtype=torch.bool)), 6)
        0.727273
    """
    lw = log_importance_weights(log_ratio, mask, level)
    shift = float(lw.max()) if lw.numel() else math.nan
    return normalized_ess(**ess_sums(lw, shift))
