"""The policy of the previous optimizer step, for ``algo.ratio_reference=previous`` (the ``onpolicy_prev_window`` arm).

On-policy GRPO (``k = i = 1``) samples from ``pi_t`` and its ratio ``pi / alpha`` is exactly 1 at its one use, so
the PPO window never binds. With ``algo.ratio_reference=previous`` the ratio is ``pi_theta / pi_{t-1}``, the
policy before the last optimizer step, clipped to ``[1 - eps, 1 + eps_high]``: the trust region that one step of
staleness gives ``algo=grpo_async`` (lag 1, window on ``pi / pi_{t-1}`` there too), without the staleness. It
separates "the window helps" from "asynchrony helps" (docs/results/stale_samples.md).

:class:`PreviousPolicy` keeps a copy of the policy's TRAINABLE parameters as they were before the last
optimizer step (LoRA: the adapters only; full fine-tuning: every weight, in their dtype) and computes
``log pi_{t-1}`` with one extra no-grad forward of the policy module with those tensors swapped in (no second
model is built). At step 0 there is no previous policy: ``pi_{-1} := pi_0``, so every ratio is 1 and nothing is
clipped. The copy is part of the checkpoint (:meth:`state_dict`), so a resumed run is exact.

Costs: memory, one copy of the trainable parameters (4 bytes a weight in float32: 2 GB for Qwen2.5-0.5B, about 4 MB
for the tiny model); time, one no-grad forward per micro-batch and one parameter copy per step; checkpoints grow
by the same copy. Not for sharded (FSDP) policies. No Lightning imports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from grpolab.errors import ConfigError


class PreviousPolicy:
    """The trainable parameters of ``pi_{t-1}`` and the forward that scores completions under them.

    Args:
        policy: the policy module being trained (its ``requires_grad`` parameters are copied).

    Raises:
        ConfigError: naming ``algo.ratio_reference`` if the policy is sharded (FSDP2 DTensors) or has no
            trainable parameter.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        self.names = [n for n, p in policy.named_parameters() if p.requires_grad]
        if not self.names:
            raise ConfigError("algo.ratio_reference=previous needs a policy with trainable parameters")
        if any(hasattr(p, "to_local") for p in policy.parameters()):
            raise ConfigError("algo.ratio_reference=previous does not support a sharded policy (trainer=fsdp); "
                              "use trainer=ddp or algo.ratio_reference=sampler")
        self.tensors: list[torch.Tensor] | None = None  # None until the first snapshot (or a loaded checkpoint)

    def _params(self, policy: torch.nn.Module) -> list[torch.nn.Parameter]:
        named = dict(policy.named_parameters())
        return [named[n] for n in self.names]

    @torch.no_grad()
    def snapshot(self, policy: torch.nn.Module) -> None:
        """Copy the policy's trainable parameters (call right before ``optimizer.step()``: they become
        ``pi_{t-1}`` for the next step). Allocates the copy on the first call, copies in place after."""
        params = self._params(policy)
        if self.tensors is None:
            self.tensors = [p.detach().clone() for p in params]
        else:
            for t, p in zip(self.tensors, params, strict=True):
                t.copy_(p.detach())

    @contextlib.contextmanager
    def swapped_in(self, policy: torch.nn.Module) -> Iterator[None]:
        """Within the block the policy's trainable parameters hold ``pi_{t-1}``'s values (their ``.data`` is
        swapped, no copy); restored on exit, also on error. Before any snapshot ``pi_{-1} := pi_t``."""
        if self.tensors is None:
            self.snapshot(policy)
        params = self._params(policy)
        saved = [p.data for p in params]
        try:
            for p, t in zip(params, self.tensors, strict=True):
                p.data = t.to(device=p.device, dtype=p.dtype)
            yield
        finally:
            for p, s in zip(params, saved, strict=True):
                p.data = s

    @torch.no_grad()
    def log_probs(self, policy: torch.nn.Module, forward: Callable[[torch.nn.Module], torch.Tensor]) -> torch.Tensor:
        """``forward(policy)`` (e.g. completion log-probs ``[B, T]``) with ``pi_{t-1}``'s weights, detached."""
        with self.swapped_in(policy):
            return forward(policy).detach()

    def state_dict(self) -> dict[str, Any]:
        """``{"names": [...], "tensors": [CPU tensors] or None}`` for the checkpoint (weights-only loadable)."""
        tensors = None if self.tensors is None else [t.detach().cpu().clone() for t in self.tensors]
        return {"names": list(self.names), "tensors": tensors}

    def load_state_dict(self, state: dict[str, Any], policy: torch.nn.Module) -> None:
        """Restore :meth:`state_dict` onto the policy's device and dtypes.

        Raises:
            ValueError: if the saved parameter names differ from this policy's trainable ones.
        """
        if list(state.get("names", [])) != self.names:
            raise ValueError("the checkpoint's previous-policy weights (algo.ratio_reference=previous) name other "
                             "parameters than this policy's trainable ones: was the model or LoRA config changed?")
        saved = state.get("tensors")
        params = self._params(policy)
        self.tensors = None if saved is None else [t.to(device=p.device, dtype=p.dtype).clone()
                                                   for t, p in zip(saved, params, strict=True)]
