"""Refresh every k steps (``rollout/refresh=steps``, the default): the paper's schedule.

With ``every: null`` the rule is the buffer's own length, ``k = algo.steps_per_generation`` minibatches of
``i = algo.num_iterations`` steps each: it never ends a buffer early and logs nothing. A number refreshes every that
many optimizer steps since the last refresh (a multiple of i, at most k x i), which is worth it beside another rule:
``rollout/refresh=[steps,drift] rollout.refresh.steps.every=4`` with k = 10 refreshes after 4 steps at the latest and
earlier on drift, and an asynchronous run takes the buffer in flight at each of them.
"""

from __future__ import annotations

from typing import Any

from grpolab.rollout.rules.base import RefreshRecord, RefreshRule
from grpolab.rollout.schedule import Schedule


class EveryKSteps(RefreshRule):
    """Refresh once ``every`` optimizer steps of the buffer were served.

    Args:
        every: steps between refreshes, a multiple of ``algo.num_iterations`` and at most the buffer's k x i; null:
            the buffer's k x i (``algo.steps_per_generation`` sets it).
    """

    name = "steps"

    def __init__(self, every: int | None = None) -> None:
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be null or an integer >= 1, got {every!r}")
        self.every = every

    def check(self, schedule: Schedule) -> None:
        if self.every is None:
            return
        if self.every % schedule.num_iterations or self.every > schedule.steps_per_buffer:
            raise ValueError(f"every must be a multiple of algo.num_iterations={schedule.num_iterations} (a buffer "
                             f"ends at a minibatch boundary) and at most algo.steps_per_generation x "
                             f"algo.num_iterations = {schedule.steps_per_buffer} (the buffer's length), got {self.every}")

    def may_end_early(self, schedule: Schedule) -> bool:
        return self.every is not None and self.every < schedule.steps_per_buffer

    def should_refresh(self, record: RefreshRecord) -> bool:
        return self.every is not None and record.position >= self.every

    def metrics(self) -> dict[str, float]:
        """``rollout/steps_refreshes`` with ``every`` set; nothing with the buffer's own length."""
        return super().metrics() if self.every is not None else {}

    def summary(self) -> dict[str, Any]:
        """``steps_every``, ``steps_refreshes`` and ``steps_refresh_steps``."""
        return {"steps_every": self.every, **super().summary()}
