"""The Theorem 1 lower bound after the optimizer step (docs/guide/objective.md#theorem-1).

Evaluated at ``pi = pi_k`` (the start of a step) the bound is about a gain of 0 and carries no information,
so it is evaluated at ``pi_{k+1}``: one no-grad forward of the step's minibatch under the updated policy.
That forward costs about a third of a training step, so it runs every ``algo.lower_bound_every`` steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grpolab.algo.diagnostics import c_weight, theorem1_group_bound
from grpolab.forward.logprob_pass import batched_log_probs

BOUND_KEYS = ("lower_bound", "lower_bound/surrogate", "lower_bound/c_tv", "lower_bound/tv_seq_k", "lower_bound/kl_step")


def bound_due(step: int, every: int | None) -> bool:
    """True on the steps (0-based, counted before the update) where ``train/lower_bound`` is computed."""
    return bool(every) and step % int(every) == 0


def lower_bound_metrics(policy: Any, mb: Any, logp_k: torch.Tensor, cfg: Any, step: int) -> dict[str, float]:
    """:func:`post_step_lower_bound` on the steps where :func:`bound_due`; NaN on the other steps (Lightning
    re-logs a step metric's last value until it is logged again, so a skipped step must say "no value": an
    empty point in the CSV and in W&B); nothing at all when ``algo.lower_bound_every`` is 0 or null."""
    if not cfg.lower_bound_every:
        return {}
    if not bound_due(step, cfg.lower_bound_every):
        return dict.fromkeys(BOUND_KEYS, math.nan)
    return post_step_lower_bound(policy, mb, logp_k, cfg)


def post_step_lower_bound(policy: Any, mb: Any, logp_k: torch.Tensor, cfg: Any) -> dict[str, float]:
    """Theorem 1 at ``pi_{k+1}`` for the minibatch ``mb`` of the step just taken.

    Args:
        policy: the policy after the optimizer step (``pi_{k+1}``).
        mb: the step's :class:`~grpolab.rollout.buffer.Minibatch`.
        logp_k: ``[B, L]`` float, the per-token log-probs under ``pi_k`` computed by the step's training forward.
        cfg: :class:`~grpolab.config.GRPOConfig` (``temperature``, ``micro_batch_size``, ``advantage_epsilon``).

    Returns:
        ``lower_bound`` (mean over the prompts in the loss of the per-prompt bound), ``lower_bound/surrogate``
        (mean ``L_x`` at ``pi_{k+1}``), ``lower_bound/c_tv`` (mean ``c_x * TV_x(pi_{k+1}, alpha)``) and
        ``lower_bound/tv_seq_k`` (mean ``TV_x(pi_k, alpha)``), as floats; and ``lower_bound/kl_step``, how far the
        step moved the policy: ``KL(pi_k || pi_{k+1})`` by the k3 estimator ``mean_t (r - 1 - log r)``,
        ``r = pi_{k+1}/pi_k`` per loss token (Schulman's estimator, as ``algo.kl_estimator=k3``). The tokens are the
        sampler's, so it is unbiased when the sampler is ``pi_k`` (on-policy, i = 1) and an estimate under alpha's
        token distribution otherwise.
    """
    logp_next = batched_log_probs(policy, mb.tensors(), cfg.temperature, cfg.micro_batch_size,
                                  cfg.shared_prompt_forward)
    logp_k = logp_k.detach().cpu().to(logp_next.dtype)
    sampler = mb.sampler_logp.cpu() if mb.sampler_logp is not None else logp_k  # lag 0, i = 1: alpha = pi_k
    mask = mb.loss_mask.cpu().bool()
    zero = torch.zeros_like(logp_next)
    delta = torch.where(mask, logp_next - sampler, zero).sum(1)
    delta_k = torch.where(mask, logp_k - sampler, zero).sum(1)
    c = c_weight(mb.info["group_std"].cpu(), cfg.advantage_epsilon)
    out = theorem1_group_bound(delta, delta_k, mb.advantages.cpu(), mb.group_ids.cpu(), c, mask.any(1))
    log_r = torch.where(mask, logp_next - logp_k, zero)
    kl_step = float((torch.expm1(log_r) - log_r).sum() / mask.sum().clamp(min=1))
    return {"lower_bound": float(out["lower_bound"]), "lower_bound/surrogate": float(out["surrogate"]),
            "lower_bound/c_tv": float(out["c_tv"]), "lower_bound/tv_seq_k": float(out["tv_seq_k"]),
            "lower_bound/kl_step": kl_step}
