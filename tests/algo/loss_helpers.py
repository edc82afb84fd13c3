"""Helpers shared by the loss tests (test_losses.py, test_clip_modes.py, test_loss_levels.py)."""

import torch

from grpolab.algo import grpo_loss, loss_denominator

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def loss_and_grad(logp, sampler, anchor, adv, mask, cfg, ref=None, denom=None):
    """Loss, gradient w.r.t. logp, stats (logp is a leaf here)."""
    logp = logp.clone().detach().requires_grad_(True)
    if denom is None:
        denom = loss_denominator(mask, cfg.loss_type, cfg.max_completion_length)
    loss, stats = grpo_loss(logp, sampler, anchor, adv, mask, cfg, denom, ref_logp=ref)
    loss.backward()
    return loss.detach(), logp.grad, stats


def per_token_loss_inputs(values):
    """Inputs making the per-token loss equal `values`: A = 0, ratio 1, beta 1, k1 with ref = logp - v."""
    logp = torch.zeros_like(values)
    return dict(logp=logp, sampler=logp, anchor=logp, adv=torch.zeros(values.shape[0]), ref=logp - values)
