"""A narrow handle on the models the rollout side samples from, filled in once the models exist."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
            combine it token-weighted); read by ``rollout.refresh=adaptive``, checkpointed by the module.
    """

    policy: torch.nn.Module | None = None
    reference: torch.nn.Module | None = None
    reference_version: int = 0
    drift: tuple[float, int] | None = None
