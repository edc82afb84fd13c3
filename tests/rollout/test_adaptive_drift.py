"""The drift the drift refresh rule (``rollout/refresh=drift``, formerly ``rollout.refresh=adaptive``) reads: over
completion tokens (a minibatch whose groups are all masked still measures it), token-weighted over ranks (one
definition for the rule and the log: tests/rollout/test_rules_over_ranks.py), and summed through a tensor on the strategy's device (a process group on GPUs
has no CPU backend)."""

from __future__ import annotations

import os
from functools import partial

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo.diagnostics import drift_sum, policy_sampler_divergence
from grpolab.app.run import run_training
from grpolab.distributed import reduce_floats_over_ranks
from grpolab.rollout.rules.base import RefreshRecord, one_process
from grpolab.rollout.rules.drift import DriftRefresh
from grpolab.rollout.schedule import Schedule


def test_drift_is_measured_over_completion_tokens_not_the_loss_mask():
    torch.manual_seed(0)
    logp, sampler = -torch.rand(4, 6), -torch.rand(4, 6)
    completion = torch.ones(4, 6, dtype=torch.bool)
    completion[:, 5] = False  # padding
    no_loss = torch.zeros(4, 6, dtype=torch.bool)  # every group zero-variance under mask_zero_std_groups
    assert float(policy_sampler_divergence(logp, sampler, no_loss)["tv_token"]) == 0.0  # what the rule read before
    total, tokens = drift_sum(logp, sampler, completion)
    assert tokens == 20
    expected = 0.5 * ((logp - sampler)[completion].exp() - 1).abs().mean()
    assert total / tokens == pytest.approx(float(expected), rel=1e-6) and total > 0
    # where every completion token is in the loss, the number train/tv_token shows, to the bit
    assert total / tokens == float(policy_sampler_divergence(logp, sampler, completion)["tv_token"])


def _record_at_position_1(drift, reduce=one_process) -> RefreshRecord:
    """What the rule reads before step 1 of a k = 4 buffer: this rank's drift of step 0's minibatch."""
    return RefreshRecord(step=1, position=1, schedule=Schedule(steps_per_generation=4), at_minibatch_boundary=True,
                         drift=drift, reduce=reduce)


@pytest.fixture
def group_without_a_cpu_backend():
    """A real process group whose device -> backend map has no CPU entry, as NCCL-only groups on GPUs."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(29000 + os.getpid() % 2000)
    dist.init_process_group(backend="cuda:gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sums_over_ranks_use_the_strategy_device(group_without_a_cpu_backend):
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.tensor([1.0]))  # a CPU tensor fails in such a group: what adaptive refresh sent
    # the strategy's root device (meta stands in for a GPU here): the all-reduce takes it; only reading the result
    # back needs a real device, so the meta tensor's copy to the CPU is what fails. The strategy is Lightning's
    # interface (world_size, root_device, reduce) over the real collective; Lightning's own reduce adds a barrier
    # that needs a real GPU in such a group.
    class Strategy:
        world_size, root_device = 2, torch.device("meta")

        @staticmethod
        def reduce(tensor, reduce_op):
            assert reduce_op == "sum"
            dist.all_reduce(tensor)
            return tensor

    # through the rule, as the data module calls it: the drift's tensor reaches the collective on the root device
    rule = DriftRefresh(max_drift=0.5)
    with pytest.raises(NotImplementedError, match="meta"):
        rule.should_refresh(_record_at_position_1((0.9, 3), partial(reduce_floats_over_ranks, Strategy())))


def test_a_masked_minibatch_still_measures_drift_in_training(tmp_path):
    """The paper's off-policy schedule: on steps whose previous minibatch had every group masked (no loss token), the
    drift read is still positive once the policy has moved from the sampler. Both situations are made by construction
    (tests/certain_reward.py): half the prompts (by uid, which the data's seed decides) score a constant reward, so
    some minibatches are wholly masked, and the others score distinct completions differently, so the policy moves."""
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *varied(constant_every=2), "algo=grpo_offpolicy",
                                       "algo.steps_per_generation=8",
                                       "algo.learning_rate=1e-3", "rollout/refresh=drift",
                                       "rollout.refresh.drift.max_drift=10",
                                       "trainer.max_steps=16", "val.at_start=false", "trainer.val_check_interval=100",
                                       "save_policy=false"])
    run_training(cfg)
    m = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
    # rollout/drift at step t is the drift of minibatch t-1: keep the steps whose previous minibatch had every group
    # masked, was read at lag >= 1, and came after a step with a learning signal (the policy had moved)
    prev = m.shift(1)
    moved = (m["train/frac_reward_zero_std"] < 1.0).cummax().shift(2, fill_value=False)
    rows = m[(prev["train/frac_reward_zero_std"] == 1.0) & (prev["train/lag"] >= 1) & moved]
    assert len(rows) >= 1, m[["train/frac_reward_zero_std", "train/lag"]]
    assert (rows["train/rollout/drift"] > 0).all(), rows["train/rollout/drift"]
