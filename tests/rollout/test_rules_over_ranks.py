"""The refresh rules' numbers over 2 processes (gloo, through Lightning's DDP strategy): the drift rule's drift is
token-weighted over the ranks and the ESS rule's ESS is the pooled batch's, and in both the rule's number and the
logged one are the same float on every rank. One spawn of 2 ranks measures both rules (each rank imports torch and
Lightning once: a spawn per rule cost that twice)."""

from __future__ import annotations

import os
import socket
from functools import partial

import forkrun
import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from grpolab.algo.ess import LEVELS, effective_sample_size
from grpolab.algo.metric_reduction import WEIGHT_NAMES
from grpolab.callbacks.step_logging import reduce_over_ranks
from grpolab.distributed import reduce_floats_over_ranks
from grpolab.handle import ServedBatch
from grpolab.rollout.rules.base import RefreshRecord
from grpolab.rollout.rules.drift import DriftRefresh
from grpolab.rollout.rules.ess import EssRefresh
from grpolab.rollout.schedule import Schedule

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")

RANK_DRIFTS = [(0.7, 3), (0.05, 97)]  # (drift sum, completion tokens): rank 0 0.23 on 3 tokens, rank 1 ~0.0005 on 97
# ESS: rank 0 2 completions of 3 tokens (one padded), rank 1 3 completions of 2 tokens; weights spread unevenly
torch.manual_seed(0)
RANK_LOG_RATIOS = [torch.randn(2, 3) * 0.5, torch.randn(3, 2) * 0.5 + 0.3]
RANK_MASKS = [torch.tensor([[1, 1, 1], [1, 1, 0]]).bool(), torch.ones(3, 2, dtype=torch.bool)]


def _record(**read) -> RefreshRecord:
    """What a rule reads before step 1 of a k = 4 buffer (this rank's numbers of step 0's minibatch)."""
    return RefreshRecord(step=1, position=1, schedule=Schedule(steps_per_generation=4), at_minibatch_boundary=True,
                         **read)


def _logged(strategy, rule, rows: float) -> float:
    """The rule's metric as the log shows it: reduced over ranks with this rank's row weight ``rows``."""
    metrics = {f"train/{k}": v for k, v in rule.metrics().items()}
    name = next(k for k in metrics if not k.endswith("_refreshes"))
    return reduce_over_ranks(strategy, metrics, {w: rows for w in WEIGHT_NAMES})[name]


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)  # Lightning's environment: this rank's root device
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        env = LightningEnvironment()
        env.set_world_size(2)
        env.set_global_rank(rank)
        strategy = DDPStrategy(parallel_devices=[torch.device("cpu")] * 2, cluster_environment=env)
        reduce = partial(reduce_floats_over_ranks, strategy)
        drift = DriftRefresh(max_drift=0.5)
        drift.should_refresh(_record(drift=RANK_DRIFTS[rank], reduce=reduce))
        # the ranks averaged other amounts (a row-weighted mean of the ranks' equal values rounds to another float)
        result = {"world": strategy.world_size,
                  "drift": {"rule": drift.last, "logged": _logged(strategy, drift, float(RANK_DRIFTS[rank][1]))}}
        served = ServedBatch(RANK_LOG_RATIOS[rank].float(), RANK_MASKS[rank], torch.zeros(RANK_MASKS[rank].shape[0]))
        for level in LEVELS:
            ess = EssRefresh(min_ess=0.5, level=level)
            ess.should_refresh(_record(served=served, reduce=reduce))
            result[level] = {"rule": ess.last, "logged": _logged(strategy, ess, float(rank + 1))}
        torch.save(result, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("two_ranks")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forkrun.spawn(_worker, (port, str(out)), 2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_two_ranks_combine_the_drift_token_weighted_for_the_rule_and_the_log(ranks):
    assert [r["world"] for r in ranks] == [2, 2]
    # sum over every rank's tokens / every rank's tokens: not the plain mean of the ranks' means (0.117)
    assert ranks[0]["drift"]["rule"] == pytest.approx(0.75 / 100)
    # one number: what each rank's rule read and what the log shows, exactly
    assert len({r["drift"][k] for r in ranks for k in ("rule", "logged")}) == 1


def test_two_ranks_pool_the_ess_for_the_rule_and_the_log(ranks):
    # the ESS of the pooled batch (both ranks' completions in one, padded to 3 tokens), not a mean of the ranks'
    pooled_ratio = torch.cat([RANK_LOG_RATIOS[0], torch.nn.functional.pad(RANK_LOG_RATIOS[1], (0, 1))])
    pooled_mask = torch.cat([RANK_MASKS[0], torch.nn.functional.pad(RANK_MASKS[1], (0, 1))])
    for level in LEVELS:
        expected = effective_sample_size(pooled_ratio, pooled_mask, level)
        own = [effective_sample_size(RANK_LOG_RATIOS[r], RANK_MASKS[r], level) for r in range(2)]
        assert ranks[0][level]["rule"] == pytest.approx(expected, rel=1e-12) and expected < 1, level
        assert abs(expected - sum(own) / 2) > 1e-3, level  # the pooling matters for these numbers
        # one number: what each rank's rule read and what the log shows, exactly
        assert len({r[level][k] for r in ranks for k in ("rule", "logged")}) == 1, level
