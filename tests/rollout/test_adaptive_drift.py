"""The drift ``rollout.refresh=adaptive`` reads: over completion tokens (a minibatch whose groups are all masked still
measures it), token-weighted over ranks (one definition for the rule and the log), and summed through a tensor on
the strategy's device (a process group on GPUs has no CPU backend)."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo.diagnostics import drift_sum, policy_sampler_divergence
from grpolab.distributed import sum_floats_over_ranks
from grpolab.rollout.adaptive import DriftRefresh
from grpolab.rollout.buffer import RolloutBuffer
from grpolab.rollout.settings import RolloutSettings
from grpolab.run import run_training


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


def _buffer_at_position_1() -> RolloutBuffer:
    buffer = RolloutBuffer(steps_per_generation=4, num_iterations=1)
    buffer.position = 1
    return buffer


def test_ranks_combine_the_drift_token_weighted():
    rule = DriftRefresh(RolloutSettings(refresh="adaptive", max_drift=0.5), num_iterations=1)
    ranks = [(0.9, 3), (0.1, 97)]  # rank 0: 0.3 on 3 tokens; rank 1: ~0.001 on 97 tokens

    def sum_over_ranks(local):  # what the all-reduce returns on every rank
        return {"sum": sum(s for s, _ in ranks), "tokens": float(sum(n for _, n in ranks))}

    drift = rule.before_step(1, _buffer_at_position_1(), ranks[0], sum_over_ranks)
    assert drift == pytest.approx(1.0 / 100)  # not the plain mean of the ranks' means (0.15)
    assert rule.metrics()["rollout/drift"] == drift


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

    with pytest.raises(NotImplementedError, match="meta"):
        sum_floats_over_ranks(Strategy(), {"sum": 1.0, "tokens": 3.0})


def test_a_masked_minibatch_still_measures_drift_in_training(tmp_path):
    """A warm-started tiny model, the paper's off-policy schedule: on steps whose previous minibatch had every group
    masked (no loss token), the drift read is still positive once the policy has moved from the sampler."""
    warm = [o for o in FAST_OVERRIDES if not o.startswith("model.")] + [
        "model.warmstart.target_accuracy=0.05", "model.warmstart.eval_every=5", "model.warmstart.num_heldout=32"]
    cfg = compose_train_cfg(tmp_path, [*warm, "algo=grpo_offpolicy", "algo.steps_per_generation=8",
                                       "algo.learning_rate=1e-3", "rollout.refresh=adaptive", "rollout.max_drift=10",
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
