"""Refresh when the effective sample size of the importance weights falls (``rollout/refresh=ess``).

Before each optimizer step, :class:`EssRefresh` reads the importance weights ``w = pi / alpha`` of the minibatch just
trained, over its completion tokens (every one, masked groups included), as the training forward measured them at
the minibatch's first use (one update behind, as the drift: the policy before that step's update), and their
effective sample size normalised to (0, 1], ``ESS = (sum w)^2 / (n sum w^2)`` (:mod:`grpolab.algo.ess`), pooled over
ranks (every rank decides alike, and ``rollout/ess`` logs that number). When it falls below ``min_ess`` the buffer
ends at that minibatch boundary and the coming step samples a new one. ``level: sequence`` takes one weight per
completion, ``pi(y|x) / alpha(y|x)`` (the product of its tokens' ratios), instead of one per token. The ESS is 1 at
lag 0 and falls as the weights spread: importance sampling resamples below a threshold, and in LLM RL it predicts
collapse under stale rollouts (arXiv 2602.17616).
"""

from __future__ import annotations

import math
from typing import Any

from grpolab.algo.ess import LEVELS, ess_sums, log_importance_weights, normalized_ess
from grpolab.algo.metric_reduction import Rule
from grpolab.rollout.rules.base import RefreshRecord, RefreshRule


class EssRefresh(RefreshRule):
    """Refresh once the normalised ESS of the last trained minibatch's importance weights falls below ``min_ess``.

    Args:
        min_ess: the threshold, in (0, 1) (e.g. 0.9).
        level: ``token`` (one weight per completion token) or ``sequence`` (one per completion).
    """

    name = "ess"
    metric_rules = {"rollout/ess": Rule("max")}  # pooled over ranks by the rule: the same on every rank

    def __init__(self, min_ess: float, level: str = "token") -> None:
        if isinstance(min_ess, bool) or not isinstance(min_ess, int | float) or not 0 < min_ess < 1:
            raise ValueError(f"min_ess must be a number in (0, 1) (the ESS is 1 at lag 0; e.g. 0.9), got {min_ess!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        self.min_ess, self.level = min_ess, level
        self.last = math.nan  # the ESS read before the current step

    def should_refresh(self, record: RefreshRecord) -> bool:
        """Whether the pooled ESS of the last trained minibatch is below ``min_ess`` (kept in :attr:`last`; NaN when
        nothing of the buffer was trained yet, or no rank measured a weight). Two collectives: the largest log weight
        (the common scale), then the sums."""
        self.last = math.nan
        if record.position == 0 or record.served is None:
            return False
        served = record.served
        log_w = log_importance_weights(served.log_ratio, served.completion_mask, self.level)
        local_max = float(log_w.max()) if log_w.numel() else -math.inf
        shift = record.reduce({"max": local_max}, "max")["max"]
        sums = record.reduce(ess_sums(log_w, shift))
        self.last = normalized_ess(sums["sum_w"], sums["sum_w2"], sums["n"])
        return self.last < self.min_ess  # False for NaN

    def metrics(self) -> dict[str, float]:
        """``rollout/ess`` (the value the rule read) and ``rollout/ess_refreshes`` (so far)."""
        return {"rollout/ess": self.last, **super().metrics()}

    def summary(self) -> dict[str, Any]:
        """``min_ess``, ``ess_level``, ``ess_refreshes`` (count) and ``ess_refresh_steps``."""
        return {"min_ess": self.min_ess, "ess_level": self.level, **super().summary()}
