"""The ESS refresh rule (rollout/refresh=ess): what it reads and when it fires (pooled over 2 processes:
tests/rollout/test_rules_over_ranks.py), and in training: exactly 1 where the sampler is the
policy, below 1 once the policy moved, refreshing below the threshold."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo.metric_reduction import Rule, explicit_rule
from grpolab.app.run import run_training
from grpolab.handle import ServedBatch
from grpolab.rollout.rules.base import RefreshRecord, one_process
from grpolab.rollout.rules.ess import EssRefresh
from grpolab.rollout.schedule import Schedule


def _served(log_ratio: torch.Tensor, mask: torch.Tensor) -> ServedBatch:
    return ServedBatch(log_ratio.float(), mask.bool(), torch.zeros(log_ratio.shape[0]))


def _record(served, position=1, reduce=one_process) -> RefreshRecord:
    return RefreshRecord(step=5, position=position, schedule=Schedule(4), at_minibatch_boundary=True, served=served,
                         reduce=reduce)


def test_the_rule_reads_the_served_weights_and_fires_below_the_threshold():
    w = torch.tensor([[1.0, 2.0, 1.0], [0.5, 1.0, 1.0]])  # token ESS (6.5^2) / (6 * 8.25) = 0.8535...
    served = _served(w.log(), torch.ones(2, 3))
    rule = EssRefresh(min_ess=0.9)
    assert rule.should_refresh(_record(served)) and rule.last == pytest.approx(6.5**2 / (6 * 8.25), rel=1e-6)
    assert not EssRefresh(min_ess=0.8).should_refresh(_record(served))
    seq = EssRefresh(min_ess=0.5, level="sequence")  # weights 2 and 0.5: 2.5^2 / (2 * 4.25) = 0.735
    assert not seq.should_refresh(_record(served)) and seq.last == pytest.approx(0.7352941, rel=1e-6)
    assert rule.metrics() == {"rollout/ess": rule.last, "rollout/ess_refreshes": 0.0}
    for record in (_record(served, position=0), _record(None)):  # nothing of the buffer trained; nothing measured
        assert not rule.should_refresh(record) and math.isnan(rule.last)
    assert explicit_rule("train/rollout/ess") == explicit_rule("train/rollout/ess_refreshes") == Rule("max")


def test_in_training_the_ess_is_one_where_the_sampler_is_the_policy_and_refreshes_below_the_bound(tmp_path):
    """k = 4: a buffer's first minibatch trains at lag 0, and step 0's learning rate is 0 (warm-up), so the ESS of a
    lag-0 minibatch, and of the lag-1 one after step 0, is exactly 1 (same weights); after a step with a learning rate
    the policy has moved (rewards vary by design) and an ESS bound of 1 - 1e-5, far above round-off and far below a
    step's move, ends the buffer at the next step."""
    common = [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=4", "algo.learning_rate=1e-2",
              *varied(), "trainer.val_check_interval=100", "val.at_start=false", "trainer.max_steps=6",
              "save_policy=false", "rollout/refresh=ess"]
    never = run_training(compose_train_cfg(tmp_path / "never", [*common, "rollout.refresh.ess.min_ess=1e-9"]))
    m = pd.read_csv(tmp_path / "never" / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
    assert never["ess_refreshes"] == 0 and never["sampler_refreshes"] == 2
    # before step s the rule reads step s-1's minibatch: lag 0 (steps 1 and 5), lag 1 after step 0 (step 2), lags 2
    # and 3 after steps with a learning rate (steps 3 and 4)
    assert math.isnan(m.loc[0, "train/rollout/ess"]) and m.loc[[1, 2, 5], "train/rollout/ess"].tolist() == pytest.approx(
        [1.0] * 3, abs=1e-7)  # round-off only: how much is the kernels' (AVX2, AVX-512) to decide
    assert (m.loc[[3, 4], "train/rollout/ess"] < 1 - 1e-5).all()
    tight = run_training(compose_train_cfg(tmp_path / "tight", [*common, "rollout.refresh.ess.min_ess=0.99999"]))
    t = pd.read_csv(tmp_path / "tight" / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
    assert tight["ess_refresh_steps"] == [3, 5] and t["train/lag"].tolist() == [0, 1, 2, 0, 1, 0]
    assert tight["unused_minibatches"] == 1 + 2 and tight["refresh"] == "adaptive"
    assert t["train/rollout/ess_refreshes"].tolist() == [0, 0, 0, 1, 1, 2]
