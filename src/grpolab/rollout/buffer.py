"""Rollout minibatches, and the buffer that serves the minibatches of one sampler refresh.

A :class:`Minibatch` holds everything one optimizer step needs about its completions: group ids,
prompt/completion ids and masks, truncation flags, rewards, advantages, the loss mask, the sampler's and the
reference's per-token log-probs when they are needed, the policy version that sampled it and the reference
version that scored it.

A :class:`RolloutBuffer` holds the ``k = steps_per_generation`` minibatches of one refresh and serves them on its
:class:`~grpolab.rollout.schedule.Schedule` (each ``i = num_iterations`` times in a row), setting each one's lag.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from grpolab.rollout.schedule import Schedule


@dataclass
class Minibatch:
    """The completions of one optimizer step. B = prompts_per_step x num_generations rows.

    Tensors: ``prompt_ids`` [B, P], ``prompt_mask`` [B, P], ``completion_ids`` [B, L], ``completion_mask``
    [B, L] bool, ``truncated`` [B] bool, ``group_ids`` [B] long (one id per prompt uid), ``rewards`` [B]
    float (NaN = unscorable, excluded from baseline and loss), ``advantages`` [B] float, ``zero_std`` [B]
    bool, ``loss_mask`` [B, L] float, ``sampler_logp`` [B, L] (log alpha) or None, ``ref_logp`` [B, L] or
    None. ``reference_version`` is the reference whose log-probs ``ref_logp`` holds (the optimizer step whose policy
    weights the reference held: :attr:`~grpolab.handle.PolicyHandle.reference_version`). ``round`` is the sampler
    refresh this came from; ``index`` its position in the buffer (its lag in
    optimizer steps, divided by num_iterations); ``iteration`` which of its ``num_iterations`` uses this is.
    ``policy_version`` is the optimizer step whose weights sampled it; ``lag`` is set when the buffer serves it:
    the optimizer steps between those weights and the step that trains on it (:func:`lag`).
    ``info`` holds plain-Python columns for logging (uids, prompt and completion text, per-function
    rewards); ``metrics`` the data module's own numbers for the step that trains on it (rollout timings). ``engine_logp`` [B, L] holds the engine's own log-probs of the sampled tokens (vLLM; None for
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
    lag: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    reference_version: int = 0

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


def lag(step: int, policy_version: int) -> int:
    """Optimizer steps between the weights that sampled a minibatch (``policy_version``) and the step that trains
    on it (``step``, steps taken before it). 0 is on-policy; the paper's off-policy minibatch j has lag j."""
    return step - policy_version


class RolloutBuffer:
    """The minibatches of the current sampler refresh and the position in its k x i schedule.

    Args:
        schedule: the k x i schedule (and ``max_lag``) the minibatches are served on.

    Attributes:
        minibatches: the k minibatches of the current refresh (empty before the first).
        position: steps served from them so far (0 .. k*i).
        rounds: refreshes so far (the next refresh's round index).
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.minibatches: list[Minibatch] = []
        self.position = 0
        self.rounds = 0

    def needs_refresh(self) -> bool:
        """True before the first refresh and once every step of the current one was served."""
        return not self.minibatches or self.position >= self.schedule.steps_per_buffer

    def has_pending(self) -> bool:
        """True while steps of the current refresh remain to be served."""
        return bool(self.minibatches) and self.position < self.schedule.steps_per_buffer

    def at_minibatch_boundary(self) -> bool:
        """True when steps remain and the next one is a minibatch's first use (where a buffer may end early)."""
        return self.has_pending() and self.schedule.at_minibatch_boundary(self.position)

    def fill(self, minibatches: list[Minibatch]) -> None:
        """Start serving a new refresh.

        Raises:
            ValueError: unless there are exactly k minibatches.
        """
        k = self.schedule.steps_per_generation
        if len(minibatches) != k:
            raise ValueError(f"a refresh must hold algo.steps_per_generation={k} minibatches, got {len(minibatches)}")
        self.minibatches = list(minibatches)
        self.position = 0
        self.rounds += 1

    def next(self, step: int) -> Minibatch:
        """The minibatch for optimizer step ``step`` (steps taken so far), with ``iteration`` and ``lag`` set.

        Raises:
            RuntimeError: if nothing is left to serve (call :meth:`fill` first), or the minibatch's lag exceeds
                ``max_lag`` (it is refused, never trained on).
        """
        if not self.has_pending():
            raise RuntimeError("RolloutBuffer.next: no step left in this refresh; fill() it first")
        mb = self.minibatches[self.schedule.minibatch(self.position)]
        mb.iteration = self.schedule.iteration(self.position)
        mb.lag = lag(step, mb.policy_version)
        max_lag = self.schedule.max_lag
        if max_lag is not None and mb.lag > max_lag:
            raise RuntimeError(f"step {step}: minibatch sampled at policy version {mb.policy_version} has lag "
                               f"{mb.lag} > rollout.max_lag={max_lag}")
        self.position += 1
        return mb

    def remaining(self) -> list[Minibatch]:
        """The minibatches that later steps still use (the current one too while it has iterations left).

        Example:
            >>> b = RolloutBuffer(Schedule(3, 1)); b.minibatches, b.position = ["a", "b", "c"], 1; b.remaining()
            ['b', 'c']
            >>> b = RolloutBuffer(Schedule(2, 2)); b.minibatches, b.position = ["a", "b"], 1; b.remaining()
            ['a', 'b']
        """
        return list(self.minibatches[self.schedule.minibatch(self.position):]) if self.has_pending() else []

    def end_early(self) -> int:
        """Serve nothing more of this refresh (the next step refreshes); returns the minibatches left unused.

        Raises:
            RuntimeError: if called inside a minibatch's ``num_iterations`` uses.
        """
        if not self.schedule.at_minibatch_boundary(self.position):
            raise RuntimeError("RolloutBuffer.end_early: only at a minibatch boundary")
        unused = len(self.remaining())
        self.position = self.schedule.steps_per_buffer
        return unused

    def state_dict(self) -> dict[str, Any]:
        """``buffer`` (minibatches as dicts), ``position``, ``rounds``."""
        return {"buffer": [mb.to_dict() for mb in self.minibatches], "position": self.position, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any], keep_minibatches: bool = True) -> None:
        """Restore :meth:`state_dict`; ``keep_minibatches=False`` keeps only the round count (the saved rows were
        dropped: the next step samples a new refresh).

        A checkpoint written before minibatches carried ``reference_version`` holds ``ref_refreshed_at``, the step of
        the reference's last refresh: every minibatch still to be served had been scored by that reference.
        """
        scored_by = {"reference_version": state.get("ref_refreshed_at", 0)}
        self.minibatches = [Minibatch.from_dict({**scored_by, **d}) for d in state["buffer"]] if keep_minibatches else []
        self.position = state["position"] if keep_minibatches else 0
        self.rounds = state["rounds"]

    @staticmethod
    def saved_has_pending(state: dict[str, Any], num_iterations: int) -> bool:
        """Whether a saved state (:meth:`state_dict`) still has steps to serve. ``position`` counts steps, up to
        ``len(buffer) * num_iterations``, not minibatches."""
        saved = Schedule(len(state.get("buffer") or []), num_iterations)
        return bool(state.get("buffer")) and state.get("position", 0) < saved.steps_per_buffer
