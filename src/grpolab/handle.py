"""A narrow handle on the models the rollout side samples from, filled in once the models exist."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class ServedBatch:
    """What the module measured on the last minibatch it trained at its first use, on this rank (read by the refresh
    rules, :mod:`grpolab.rollout.rules`).

    Attributes:
        log_ratio: ``[B, T]`` float32 on the CPU, ``log pi - log alpha`` per token: the policy's log-probs before that
            step's update against the sampler's (0 at lag 0 without sampler log-probs, and at padding).
        completion_mask: ``[B, T]`` bool, the completion tokens (every one: masked groups included).
        rewards: ``[B]`` float32, each completion's reward (NaN = unscorable).
    """

    log_ratio: torch.Tensor
    completion_mask: torch.Tensor
    rewards: torch.Tensor

    @classmethod
    def measure(cls, logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor,
                rewards: torch.Tensor) -> ServedBatch:
        """From the training forward's ``logp`` [B, T] and the minibatch's ``sampler_logp`` [B, T] (detached, copied
        to the CPU)."""
        mask = completion_mask.detach().bool().to(logp.device)
        delta = (logp.detach().float() - sampler_logp.detach().float()).masked_fill(~mask, 0.0)
        return cls(delta.cpu(), mask.cpu(), rewards.detach().float().cpu())

    def to_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors, for a checkpoint (read with ``torch.load(weights_only=True)``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any] | None) -> ServedBatch | None:
        return None if state is None else cls(**{f.name: state[f.name] for f in fields(cls)})


@dataclass
class PolicyHandle:
    """The live policy, the frozen reference model and what the module measured; written by the module only.

    :class:`~grpolab.module.GRPOModule` creates the handle empty and fills it in ``configure_model`` (models are
    built there, after the data module was connected); the data module reads it, and never holds the module.

    Attributes:
        policy: the policy being trained (None until built).
        reference: the frozen reference model, or None (``algo.beta = 0``, or LoRA with the adapters off). The
            module refreshes it (``algo.ref_refresh_every``, :mod:`grpolab.reference_refresh`).
        reference_version: the optimizer step whose policy weights ``reference`` holds (0: the initial policy);
            the data module stamps the reference log-probs it computes with it (``Minibatch.reference_version``).
        drift: the policy/sampler drift the module measured on the last minibatch it trained at first use, as
            ``(sum, tokens)`` over its completion tokens (:func:`grpolab.algo.diagnostics.drift_sum`, so ranks
            combine it token-weighted); read by the drift refresh rule, checkpointed by the module.
        served: the log-ratios, completion mask and rewards of that minibatch (:class:`ServedBatch`); read by refresh
            rules, checkpointed by the module (per rank).
    """

    policy: torch.nn.Module | None = None
    reference: torch.nn.Module | None = None
    reference_version: int = 0
    drift: tuple[float, int] | None = None
    served: ServedBatch | None = None
