"""``rollout.refresh=adaptive``: refresh the sampler when the policy has drifted from it, not only every k steps.

Before each optimizer step, :class:`DriftRefresh` reads the drift measured on the minibatch just trained: the
token-level total-variation estimate ``0.5 * mean_t |pi / alpha - 1|`` over its completion tokens (every one,
masked groups included: the drift does not depend on rewards), taken by the training forward at the minibatch's
first use (the module writes it to the :class:`~grpolab.handle.PolicyHandle` the data module reads, as a sum and a
token count, and checkpoints it), token-weighted over ranks so every rank decides alike (``rollout/drift`` logs the same number). When it passes ``rollout.max_drift`` the buffer ends at that
minibatch boundary and the coming step samples a new one from the current policy. ``algo.steps_per_generation``
stays the latest refresh. The estimate is free (no extra forward) and one update behind: it is the drift at the
start of the last step, before that step's update. Theorem 1's bound is in terms of this divergence, so the
trust region is what the setting controls, rather than k.

Under ``rollout.async_generation`` the same rule runs on the buffer being served (sampled from the weights the
sampler took one buffer earlier): when its drift passes the bound, that buffer ends, the trainer takes the buffer
in flight (sampled from newer weights; it waits for it if it is not done), and the sampler takes the current
weights for the next one at once (:class:`~grpolab.rollout.refresh.AsyncRefresh`). So the sampler takes new
weights when the drift of the buffer it serves passes the bound, and the lag shrinks to what the bound allows.
Every decision is taken at a step boundary from the logged drift of the step before, never from timing: the
buffer in flight is joined, not polled, so a run is bitwise reproducible and resumes exactly (the checkpoint
holds the counters, the last drift and the buffer in flight).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpolab.rollout.buffer import RolloutBuffer


class DriftRefresh:
    """The early-refresh rule and its counters (checkpointed with the rollout state).

    Args:
        max_drift: ``rollout.max_drift`` with ``rollout.refresh=adaptive``; None: the rule is off (``refresh=steps``).

    Attributes:
        steps: optimizer steps (steps taken before them) that refreshed early.
        unused_minibatches: minibatches those early refreshes left untrained (their prompts are not reused).
    """

    def __init__(self, max_drift: float | None) -> None:
        self.enabled = max_drift is not None
        self.max_drift = max_drift
        self.steps: list[int] = []
        self.unused_minibatches = 0
        self.last = math.nan  # the drift read before the current step
        self._saved: tuple[float, int] | float | None = None  # an older checkpoint's drift, read once after resume

    def before_step(self, step: int, buffer: RolloutBuffer, measured: tuple[float, int] | float | None,
                    sum_over_ranks: Callable[[dict[str, float]], dict[str, float]] | None = None) -> float:
        """End ``buffer`` if the drift of the last trained minibatch passes the bound; returns that drift (NaN when
        disabled or nothing of this buffer was trained yet).

        Args:
            step: the coming optimizer step.
            buffer: the buffer being served (ended at a minibatch boundary of its schedule).
            measured: this rank's ``(sum, tokens)`` (:func:`grpolab.algo.diagnostics.drift_sum`); a float from a
                checkpoint of an older version counts as one token.
            sum_over_ranks: sums a dict of floats over the data-parallel ranks (a collective every rank calls at the
                same step; :func:`grpolab.distributed.sum_floats_over_ranks`); None in one process. The drift is
                ``sum / tokens`` over every rank's completion tokens: one definition, token-weighted, which the
                rule reads and ``rollout/drift`` logs.
        """
        self.last = math.nan
        if measured is None:
            measured, self._saved = self._saved, None
        if not self.enabled or buffer.position == 0 or measured is None:
            return self.last
        total, tokens = (float(measured), 1) if isinstance(measured, (int, float)) else measured
        local = {"sum": float(total), "tokens": float(tokens)}
        summed = sum_over_ranks(local) if sum_over_ranks is not None else local
        drift = summed["sum"] / summed["tokens"] if summed["tokens"] > 0 else 0.0
        self.last = drift
        if buffer.at_minibatch_boundary() and drift > self.max_drift:
            self.unused_minibatches += buffer.end_early()
            self.steps.append(step)
        return drift

    def metrics(self) -> dict[str, float]:
        """The step's ``rollout/drift`` (the value the rule read) and ``rollout/drift_refreshes`` (so far); empty
        unless ``refresh=adaptive``."""
        return {"rollout/drift": self.last, "rollout/drift_refreshes": float(len(self.steps))} if self.enabled else {}

    def summary(self) -> dict[str, Any]:
        """``refresh``, ``max_drift``, ``drift_refreshes`` (count), ``drift_refresh_steps`` and
        ``unused_minibatches``."""
        return {"refresh": "adaptive" if self.enabled else "steps", "max_drift": self.max_drift,
                "drift_refreshes": len(self.steps),
                "drift_refresh_steps": list(self.steps), "unused_minibatches": self.unused_minibatches}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "unused_minibatches": self.unused_minibatches}

    def load_state_dict(self, state: dict[str, Any], saved_drift: tuple[float, int] | float | None = None) -> None:
        """Restore :meth:`state_dict`. ``saved_drift``: the drift a checkpoint of an older version kept in the rollout
        state (the module keeps it now); the first step after the resume reads it when the module has none."""
        self.steps = list(state.get("steps", []))
        self.unused_minibatches = int(state.get("unused_minibatches", 0))
        self._saved = saved_drift
