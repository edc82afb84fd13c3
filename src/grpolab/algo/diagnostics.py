"""Diagnostics from the paper's theory (docs/guide/objective.md#theorem-1): the weight c(x), policy/sampler
divergence estimates, the importance-sampled surrogate and the Theorem 1 lower bound.

All functions are detached (no gradient) and return 0 rather than NaN when a mask selects nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor


def c_weight(std: Tensor, epsilon: float) -> Tensor:
    """Theorem 1 penalty weight ``c = (1 - sqrt(std**2 + eps)) / sqrt(std**2 + eps)`` (docs/guide/objective.md#theorem-1).

    Args:
        std: ``[...]`` float, reward std of the group (for Bernoulli rewards ``sqrt(p * (1 - p))``).
        epsilon: variance floor ``>= 0`` (``algo.advantage_epsilon``); with ``epsilon = 0`` a zero std
            gives ``inf``, the honest value of the bound.

    Returns:
        ``[...]`` float, ``c`` per entry (1.0 at p = 0.5, 2.33 at p = 0.1, ``1/sqrt(eps) - 1`` at p = 0).

    Raises:
        ValueError: if ``epsilon < 0``.

    Example:
        >>> p = torch.tensor([0.5, 0.1])
        >>> c_weight((p * (1 - p)).sqrt(), 1e-8)
        tensor([1.0000, 2.3333])
    """
    if not epsilon >= 0:
        raise ValueError(f"algo.advantage_epsilon must be >= 0, got {epsilon}")
    s = (std.detach().to(torch.promote_types(std.dtype, torch.float32)) ** 2 + epsilon).sqrt()
    return (1.0 - s) / s


def _mean_or_zero(x: Tensor) -> Tensor:
    return x.mean() if x.numel() else x.new_zeros(())


def drift_sum(logp: Tensor, sampler_logp: Tensor, completion_mask: Tensor) -> tuple[float, int]:
    """The policy/sampler drift of a minibatch as a sum and a count, so ranks combine it token-weighted:
    ``(0.5 * sum_t |exp(logp_t - sampler_logp_t) - 1|, number of tokens)`` over every completion token.

    Over the completion tokens, not the loss tokens: the total variation between the policy and the sampler does not
    depend on rewards, so a minibatch whose groups are all masked (zero reward variance) still measures it.
    The drift refresh rule (``rollout/refresh=drift``) reads ``sum / count`` (summed over ranks first).

    Args:
        logp: ``[B, T]`` policy log-probs.
        sampler_logp: ``[B, T]`` sampler log-probs.
        completion_mask: ``[B, T]`` bool or 0/1, the completion's tokens (no padding).

    Returns:
        ``(sum as a Python float, token count as an int)``; ``(0.0, 0)`` for an empty mask.

    Raises:
        ValueError: on shape mismatch.
    """
    if sampler_logp.shape != logp.shape or completion_mask.shape != logp.shape:
        raise ValueError(f"logp, sampler_logp and completion_mask must share a shape, got {tuple(logp.shape)}, "
                         f"{tuple(sampler_logp.shape)}, {tuple(completion_mask.shape)}")
    m = completion_mask.bool()
    dtype = torch.promote_types(logp.dtype, torch.float32)
    tok = logp.detach().to(dtype)[m] - sampler_logp.detach().to(dtype)[m]
    count = int(m.sum())
    # the mean as train/tv_token takes it (one process: sum / count gives back exactly this float, so a minibatch
    # without masked tokens reads the same number as before), times the count (exact in float64)
    return float(0.5 * _mean_or_zero((tok.exp() - 1).abs())) * count, count


def policy_sampler_divergence(logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Token- and sequence-level divergence estimates between the policy and the sampler (§3.6 item 5).

    With ``delta_t = logp_t - sampler_logp_t`` on loss tokens and ``Delta_i = sum_t delta_t``:

    * ``tv_token`` = ``0.5 * mean_t |exp(delta_t) - 1|`` over all loss tokens;
    * ``tv_seq`` = ``0.5 * mean_i |exp(Delta_i) - 1|`` over sequences with >= 1 loss token (heavy-tailed;
      ``inf`` when ``exp`` overflows, never clamped);
    * ``kl_sampler_policy`` = ``mean_i(-Delta_i)``, a sample estimate of ``KL(alpha || pi)``;
    * ``log_ratio_seq_mean`` / ``_max`` / ``_min`` of ``Delta_i``; ``num_sequences``.

    Args:
        logp: ``[B, T]`` policy log-probs (detached here).
        sampler_logp: ``[B, T]`` sampler log-probs.
        mask: ``[B, T]`` bool or 0/1 loss mask.

    Returns:
        Dict of 0-dim float tensors; every value is 0 when the mask is empty.

    Raises:
        ValueError: on shape mismatch.
    """
    if logp.dim() != 2 or sampler_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, sampler_logp and mask must share a [B, T] shape, got {tuple(logp.shape)}, "
            f"{tuple(sampler_logp.shape)}, {tuple(mask.shape)}"
        )
    m = mask.bool()
    dtype = torch.promote_types(logp.dtype, torch.float32)
    delta = torch.where(
        m, logp.detach().to(dtype) - sampler_logp.detach().to(dtype), torch.zeros((), dtype=dtype)
    )
    seq_valid = m.any(1)
    seq = delta.sum(1)[seq_valid]
    tok = delta[m]
    return {
        "tv_token": 0.5 * _mean_or_zero((tok.exp() - 1).abs()),
        "tv_seq": 0.5 * _mean_or_zero((seq.exp() - 1).abs()),
        "kl_sampler_policy": _mean_or_zero(-seq),
        "log_ratio_seq_mean": _mean_or_zero(seq),
        "log_ratio_seq_max": seq.max() if seq.numel() else delta.new_zeros(()),
        "log_ratio_seq_min": seq.min() if seq.numel() else delta.new_zeros(()),
        "num_sequences": seq_valid.sum().to(dtype),
    }


def surrogate(seq_log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Unclipped IS surrogate ``L = mean_i exp(Delta_i) * A_i`` over unmasked sequences (§2.1, §3.6 item 6).

    Args:
        seq_log_ratio: ``[B]`` float, ``Delta_i = log pi(y_i|x) - log alpha(y_i|x)``.
        advantages: ``[B]`` float.
        mask: ``[B]`` bool, sequences to include.

    Returns:
        0-dim tensor; 0 when no sequence is selected.

    Raises:
        ValueError: on shape mismatch.

    Example:
        >>> surrogate(torch.tensor([0.0, 0.0]), torch.tensor([1.0, -0.5]), torch.tensor([True, True]))
        tensor(0.2500)
    """
    if (
        seq_log_ratio.dim() != 1
        or advantages.shape != seq_log_ratio.shape
        or mask.shape != seq_log_ratio.shape
    ):
        raise ValueError("seq_log_ratio, advantages and mask must share a [B] shape")
    m = mask.bool()
    vals = seq_log_ratio.detach()[m].exp() * advantages.detach().to(seq_log_ratio.dtype)[m]
    return _mean_or_zero(vals)


def theorem1_lower_bound(
    surrogate: Tensor | float,
    c_mean: Tensor | float,
    tv_pi_alpha: Tensor | float,
    tv_pik_alpha: Tensor | float,
) -> Tensor:
    """Theorem 1 bound ``LB = L - 2 * c * TV(pi, alpha) - 2 * TV(pi_k, alpha)`` (docs/guide/objective.md#theorem-1).

    The theorem holds per prompt; the arguments broadcast elementwise, so per-group tensors can be passed
    and averaged afterwards (``mean(c * TV)`` is not ``mean(c) * mean(TV)``).

    Returns:
        Tensor of the broadcast shape (0-dim for scalars), detached.

    Example:
        >>> theorem1_lower_bound(0.5, 1.0, 0.1, 0.05)
        tensor(0.2000)
    """
    args = [torch.as_tensor(a).detach() for a in (surrogate, c_mean, tv_pi_alpha, tv_pik_alpha)]
    dtype = torch.float64 if any(a.dtype == torch.float64 for a in args) else torch.float32
    l_val, c, tv1, tv2 = (a.to(dtype) for a in args)
    return l_val - 2.0 * c * tv1 - 2.0 * tv2


def theorem1_group_bound(
    seq_log_ratio: Tensor,
    seq_log_ratio_k: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    c: Tensor,
    mask: Tensor,
) -> dict[str, Tensor]:
    """Theorem 1 per prompt, then averaged over prompts (docs/guide/objective.md#theorem-1).

    For each group ``x`` (the sequences of one prompt that are in the loss):
    ``LB_x = L_x - 2 * c_x * TV_x(pi, alpha) - 2 * TV_x(pi_k, alpha)`` with ``L_x = mean_i exp(Delta_i) * A_i``,
    ``TV_x(pi, alpha) = 0.5 * mean_i |exp(Delta_i) - 1|`` and ``TV_x(pi_k, alpha)`` the same with ``Delta^k_i``.
    The products ``c_x * TV_x`` are taken per group (``mean(c) * mean(TV)`` is not the bound). Evaluated at
    ``pi = pi_{k+1}`` (after the optimizer step) it bounds the step's gain; at ``pi = pi_k`` the gain is 0.

    Args:
        seq_log_ratio: ``[B]`` float, ``Delta_i = log pi(y_i|x) - log alpha(y_i|x)`` (summed over loss tokens).
        seq_log_ratio_k: ``[B]`` float, the same for ``pi_k``.
        advantages: ``[B]`` float.
        group_ids: ``[B]`` integer prompt uid.
        c: ``[B]`` float, ``c_x`` of each row's group (:func:`c_weight`).
        mask: ``[B]`` bool, sequences in the loss.

    Returns:
        Dict of 0-dim float tensors (0 when no sequence is selected): ``lower_bound`` (mean of ``LB_x``),
        ``surrogate`` (mean of ``L_x``), ``c_tv`` (mean of ``c_x * TV_x(pi, alpha)``), ``tv_seq`` (mean of
        ``TV_x(pi, alpha)``), ``tv_seq_k`` (mean of ``TV_x(pi_k, alpha)``), ``num_groups``.

    Raises:
        ValueError: on shape mismatch.

    Example:
        >>> out = theorem1_group_bound(torch.zeros(2), torch.zeros(2), torch.tensor([1.0, -1.0]),
        ...                            torch.tensor([0, 0]), torch.ones(2), torch.tensor([True, True]))
        >>> float(out["lower_bound"]), float(out["num_groups"])
        (0.0, 1.0)
    """
    tensors = (seq_log_ratio_k, advantages, group_ids, c, mask)
    if seq_log_ratio.dim() != 1 or any(t.shape != seq_log_ratio.shape for t in tensors):
        raise ValueError("seq_log_ratio, seq_log_ratio_k, advantages, group_ids, c and mask must share a [B] shape")
    m = mask.bool()
    dtype = torch.promote_types(seq_log_ratio.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype)
    if not m.any():
        return {k: zero for k in ("lower_bound", "surrogate", "c_tv", "tv_seq", "tv_seq_k", "num_groups")}
    ratio = seq_log_ratio.detach().to(dtype)[m].exp()
    ratio_k = seq_log_ratio_k.detach().to(dtype)[m].exp()
    adv, cm = advantages.detach().to(dtype)[m], c.detach().to(dtype)[m]
    _, inv = torch.unique(group_ids[m], return_inverse=True)
    n = int(inv.max()) + 1
    count = torch.zeros(n, dtype=dtype).index_add_(0, inv, torch.ones_like(adv))

    def group_mean(x: Tensor) -> Tensor:
        return torch.zeros(n, dtype=dtype).index_add_(0, inv, x) / count

    sur = group_mean(ratio * adv)
    tv = 0.5 * group_mean((ratio - 1).abs())
    tv_k = 0.5 * group_mean((ratio_k - 1).abs())
    c_x = group_mean(cm)  # one value per group
    lb = sur - 2.0 * c_x * tv - 2.0 * tv_k
    return {"lower_bound": lb.mean(), "surrogate": sur.mean(), "c_tv": (c_x * tv).mean(), "tv_seq": tv.mean(),
            "tv_seq_k": tv_k.mean(), "num_groups": torch.tensor(float(n), dtype=dtype)}


def weight_quantiles(logp: Tensor, sampler_logp: Tensor, mask: Tensor, qs: tuple[float, ...] = (0.5, 0.9, 0.99)
                     ) -> dict[str, Tensor]:
    """Quantiles of the token importance weight ``pi / alpha`` over the loss tokens (the claim study asks: do large
    weights at high lag carry the loss?).

    With ``logp`` from the step's forward at the first use of a minibatch (``pi = pi_k``) this is the
    distribution of ``pi_k / alpha``, the weight the paper's off-policy clip leaves unbounded.

    Args:
        logp: ``[B, T]`` policy log-probs (detached here).
        sampler_logp: ``[B, T]`` sampler log-probs ``log alpha``.
        mask: ``[B, T]`` bool or 0/1 loss mask.
        qs: quantile levels in ``[0, 1]``.

    Returns:
        ``{"q50": ..., "q90": ..., "q99": ...}`` (keys ``q<100*q>``), 0-dim float tensors; all 1.0 when the mask
        is empty.

    Raises:
        ValueError: on shape mismatch.

    Example:
        >>> lp = torch.log(torch.tensor([[1.0, 2.0, 4.0]]))
        >>> {k: float(v) for k, v in weight_quantiles(lp, torch.zeros(1, 3), torch.ones(1, 3), (0.5, 1.0)).items()}
        {'q50': 2.0, 'q100': 4.0}
    """
    if logp.dim() != 2 or sampler_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError("logp, sampler_logp and mask must share a [B, T] shape")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    m = mask.bool()
    w = (logp.detach().to(dtype) - sampler_logp.detach().to(dtype))[m].exp()
    names = [f"q{round(100 * q)}" for q in qs]
    if not w.numel():
        return {n: torch.ones((), dtype=dtype) for n in names}
    vals = torch.quantile(w, torch.tensor(qs, dtype=dtype, device=w.device))
    return dict(zip(names, vals))
