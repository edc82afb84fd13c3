"""Per-token KL estimators to the reference policy, and a masked mean (docs/guide/pitfalls.md #10).

As VALUES, k1, k2 and k3 all estimate ``KL(pi || ref)`` from samples of ``pi`` (k1 unbiased, k3 unbiased and
non-negative, k2 biased). As LOSS TERMS (differentiated through ``logp`` with the samples fixed, as in TRL
and here) their gradients differ. With ``y ~ pi`` and ``d = ref_logp - logp``:

* ``k1 = -d``: gradient ``grad log pi``, whose expectation is ZERO: the penalty does not pull the policy
  towards the reference at all (``GRPOConfig`` warns on ``kl_estimator=k1`` with ``beta > 0``);
* ``k2 = d**2 / 2``: gradient ``-d * grad log pi``, in expectation ``grad KL(pi || ref)``;
* ``k3 = exp(d) - d - 1``: gradient ``(1 - exp(d)) * grad log pi``, in expectation ``grad KL(ref || pi)``
  (TRL's choice and default; DeepSeekMath's GRPO).

The expectations hold for samples from the current policy (lag 0, first iteration); the KL term carries no
importance weight, as in TRL.

No clamp is applied to any estimator: a huge or non-finite value (e.g. ``ref_logp = -inf``) propagates
into the loss, where the trainer's non-finite-loss check stops the run instead of hiding it.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` from samples of the policy (Schulman, 2020).

    With ``d = ref_logp - logp``: ``k1 = -d = logp - ref_logp``; ``k2 = 0.5 * d**2``;
    ``k3 = exp(d) - d - 1`` (TRL's default, computed as ``expm1(d) - d`` for accuracy near 0).

    Args:
        logp: ``[...]`` float, policy log-probs of the sampled tokens (may require grad).
        ref_logp: ``[...]`` float, reference log-probs, same shape.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (config ``algo.kl_estimator``).

    Returns:
        ``[...]`` per-token estimate, not reduced and not masked.

    Raises:
        ValueError: unknown estimator or shape mismatch.

    Example:
        >>> kl_penalty(torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -2.0]))
        tensor([0.0000, 0.3679])
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"algo.kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} must have the same shape"
        )
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.expm1(d) - d


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is nonzero; 0 where there are none (never NaN).

    Masked-out entries are excluded with ``torch.where``, so NaN/inf there (padding) cannot leak in.

    Args:
        x: ``[...]`` float.
        mask: same shape as ``x``, bool or 0/1 numbers.
        dim: reduce over this dim, or over everything if ``None``.
        keepdim: keep the reduced dim (only with ``dim``).

    Returns:
        0-dim tensor (``dim=None``) or ``x`` reduced over ``dim``.

    Raises:
        ValueError: if the shapes differ.

    Example:
        >>> masked_mean(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))
        tensor(2.)
    """
    if x.shape != mask.shape:
        raise ValueError(f"x {tuple(x.shape)} and mask {tuple(mask.shape)} must have the same shape")
    m = mask.bool()
    xs = torch.where(m, x, torch.zeros_like(x))
    if dim is None:
        return xs.sum() / m.sum().clamp(min=1).to(xs.dtype)
    return xs.sum(dim, keepdim=keepdim) / m.sum(dim, keepdim=keepdim).clamp(min=1).to(xs.dtype)
