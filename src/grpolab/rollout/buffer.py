"""Rollout minibatches and the prompt sampler.

A :class:`Minibatch` holds everything one optimizer step needs about its completions (design.md §1):
group ids, prompt/completion ids and masks, truncation flags, rewards, advantages, the loss mask, and the
sampler's and reference's per-token log-probs when they are needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class Minibatch:
    """The completions of one optimizer step. B = prompts_per_step x num_generations rows.

    Tensors: ``prompt_ids`` [B, P], ``prompt_mask`` [B, P], ``completion_ids`` [B, L], ``completion_mask``
    [B, L] bool, ``truncated`` [B] bool, ``group_ids`` [B] long (one id per prompt uid), ``rewards`` [B]
    float (NaN = unscorable, excluded from baseline and loss), ``advantages`` [B] float, ``zero_std`` [B]
    bool, ``loss_mask`` [B, L] float, ``sampler_logp`` [B, L] (log alpha) or None, ``ref_logp`` [B, L] or
    None. ``round`` is the sampler refresh this came from; ``index`` its position in the buffer (its lag in
    optimizer steps, divided by num_iterations); ``iteration`` which of its ``num_iterations`` uses this is.
    ``info`` holds plain-Python columns for logging (uids, prompt and completion text, per-function
    rewards). ``engine_logp`` [B, L] holds the engine's own log-probs of the sampled tokens (vLLM; None for
    engines that report none), kept to measure the train-inference mismatch; ``sampler_logp_from_engine``
    says that ``sampler_logp`` IS ``engine_logp`` (no trainer forward was spent on it).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    zero_std: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    round: int = 0
    index: int = 0
    iteration: int = 0
    policy_version: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    engine_logp: torch.Tensor | None = None
    sampler_logp_from_engine: bool = False

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of tensors, numbers, strings and lists (loadable with ``torch.load(weights_only=True)``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Minibatch:
        return cls(**state)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The four sequence tensors used by a forward pass."""
        return {k: getattr(self, k) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}

    def rows(self, start: int, stop: int) -> dict[str, torch.Tensor | None]:
        """Row slice of every per-row tensor (for micro-batching)."""
        names = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "loss_mask",
                 "sampler_logp", "ref_logp", "engine_logp")
        return {k: (None if getattr(self, k) is None else getattr(self, k)[start:stop]) for k in names}


class PromptSampler:
    """Endless, seeded sampling of training prompts without replacement within an epoch.

    Its state (epoch and position) goes into the checkpoint so a resumed run draws the same prompts.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("data: the training split has no rows")
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_rows, generator=g).tolist()

    def take(self, n: int) -> list[int]:
        """The next ``n`` row indices (crossing epoch boundaries as needed)."""
        out = []
        while len(out) < n:
            if self.position >= self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation()
            take = min(n - len(out), self.num_rows - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
