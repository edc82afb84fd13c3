"""A narrow handle on the models the rollout side samples from, filled in once the models exist."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyHandle:
    """The live policy and the frozen reference model.

    :class:`~grpolab.module.GRPOModule` creates the handle empty and fills it in ``configure_model`` (models are
    built there, after the data module was connected); the data module reads it, and never holds the module.

    Attributes:
        policy: the policy being trained (None until built).
        reference: the frozen reference model, or None (``algo.beta = 0``, or LoRA with the adapters off).
        drift: the policy/sampler drift the module measured on the last minibatch it trained at first use, as
            ``(sum, tokens)`` over its completion tokens (:func:`grpolab.algo.diagnostics.drift_sum`, so ranks
            combine it token-weighted); read by ``rollout.refresh=adaptive``.
    """

    policy: torch.nn.Module | None = None
    reference: torch.nn.Module | None = None
    drift: tuple[float, int] | None = None
