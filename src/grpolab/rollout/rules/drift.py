"""Refresh on measured drift (``rollout/refresh=drift``; the old spelling ``rollout.refresh=adaptive``).

Before each optimizer step, :class:`DriftRefresh` reads the drift measured on the minibatch just trained: the
token-level total-variation estimate ``0.5 * mean_t |pi / alpha - 1|`` over its completion tokens (every one,
masked groups included: the drift does not depend on rewards), taken by the training forward at the minibatch's
first use (the module writes it to the :class:`~grpolab.handle.PolicyHandle`, as a sum and a token count, and
checkpoints it), token-weighted over ranks so every rank decides alike (``rollout/drift`` logs the same number). When
it passes ``max_drift`` the buffer ends at that minibatch boundary and the coming step samples a new one from the
current policy. The estimate is free (no extra forward) and one update behind: it is the drift at the start of the
last step, before that step's update. Theorem 1's bound is in terms of this divergence, so the trust region is what
the setting controls, rather than k.

Under ``rollout.async_generation`` the same rule runs on the buffer being served (sampled from the weights the
sampler took one buffer earlier): when its drift passes the bound, that buffer ends, the trainer takes the buffer
in flight (sampled from newer weights; it waits for it if it is not done), and the sampler takes the current
weights for the next one at once (:class:`~grpolab.rollout.refresh.AsyncRefresh`).
"""

from __future__ import annotations

import math
from typing import Any

from grpolab.algo.metric_reduction import Rule
from grpolab.rollout.rules.base import RefreshRecord, RefreshRule


class DriftRefresh(RefreshRule):
    """Refresh once the drift of the last trained minibatch passes ``max_drift``.

    Args:
        max_drift: the bound, a number > 0 (e.g. 0.05).
    """

    name = "drift"
    # the drift the rule read: already token-weighted over ranks, the same on every rank, so the log shows it exactly
    metric_rules = {"rollout/drift": Rule("max")}

    def __init__(self, max_drift: float) -> None:
        if isinstance(max_drift, bool) or not isinstance(max_drift, int | float) or not max_drift > 0:
            raise ValueError(f"max_drift must be a number > 0 (e.g. 0.05), got {max_drift!r}")
        self.max_drift = max_drift
        self.last = math.nan  # the drift read before the current step
        self._saved: tuple[float, int] | float | None = None  # an older checkpoint's drift, read once after resume

    def should_refresh(self, record: RefreshRecord) -> bool:
        """Whether the drift of the last trained minibatch passes the bound (kept in :attr:`last`; NaN when nothing
        of the buffer was trained yet). A float drift (a checkpoint of an older version) counts as one token."""
        self.last = math.nan
        measured = record.drift
        if measured is None:
            measured, self._saved = self._saved, None
        if record.position == 0 or measured is None:
            return False
        total, tokens = (float(measured), 1) if isinstance(measured, (int, float)) else measured
        summed = record.reduce({"sum": float(total), "tokens": float(tokens)})
        self.last = summed["sum"] / summed["tokens"] if summed["tokens"] > 0 else 0.0
        return self.last > self.max_drift

    def metrics(self) -> dict[str, float]:
        """``rollout/drift`` (the value the rule read) and ``rollout/drift_refreshes`` (so far)."""
        return {"rollout/drift": self.last, **super().metrics()}

    def summary(self) -> dict[str, Any]:
        """``max_drift``, ``drift_refreshes`` (count) and ``drift_refresh_steps``."""
        return {"max_drift": self.max_drift, **super().summary()}

    def load_old_layout(self, rollout_state: dict[str, Any]) -> None:
        """The counters of ``rollout.refresh=adaptive`` (``drift_refresh``), and the drift that a checkpoint written
        before the module owned it kept (``drift``): the first step after the resume reads it when the module has
        none."""
        self.load_state_dict(rollout_state.get("drift_refresh") or {})
        self._saved = rollout_state.get("drift")
