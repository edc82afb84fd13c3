"""A refresh rule written against the interface alone, outside grpolab (tests/rollout/test_refresh_rules.py selects
it with conf/rollout/refresh/reward_record.yaml beside this file): refresh when the minibatch just trained scored a
new record mean reward, pooled over ranks. It reads the served rewards, logs one metric and keeps its record in the
checkpoint."""

from __future__ import annotations

import math
from typing import Any

from grpolab.algo.metric_reduction import Rule
from grpolab.rollout.rules.base import RefreshRecord, RefreshRule


class RewardRecordRefresh(RefreshRule):
    """Refresh once the last trained minibatch's mean reward beats the best read so far by ``margin``."""

    name = "reward_record"
    metric_rules = {"rollout/served_reward": Rule("max")}  # pooled by the rule: the same on every rank

    def __init__(self, margin: float = 0.0) -> None:
        if isinstance(margin, bool) or not isinstance(margin, int | float) or margin < 0:
            raise ValueError(f"margin must be a number >= 0, got {margin!r}")
        self.margin = margin
        self.best = -math.inf
        self.last = math.nan

    def should_refresh(self, record: RefreshRecord) -> bool:
        self.last = math.nan
        if record.position == 0 or record.served is None:
            return False
        rewards = record.served.rewards[~record.served.rewards.isnan()]
        pooled = record.reduce({"sum": float(rewards.sum()), "n": float(rewards.numel())})
        if not pooled["n"]:
            return False
        self.last = pooled["sum"] / pooled["n"]
        beaten = self.last > self.best + self.margin
        self.best = max(self.best, self.last)
        return beaten

    def metrics(self) -> dict[str, float]:
        return {"rollout/served_reward": self.last, **super().metrics()}

    def summary(self) -> dict[str, Any]:
        return {"reward_record_best": self.best if math.isfinite(self.best) else None, **super().summary()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best = float(state.get("best", -math.inf))
