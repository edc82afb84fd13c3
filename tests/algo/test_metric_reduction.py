"""Step metrics combined over ranks equal the metrics of the pooled batch (grpolab.algo.metric_reduction)."""

import doctest
import math

import pytest
import torch

import grpolab.algo.metric_reduction as red
from grpolab.algo.advantages import group_reward_summary
from grpolab.algo.diagnostics import c_weight, policy_sampler_divergence, surrogate
from grpolab.algo.kl import masked_mean
from grpolab.algo.losses import LossConfig, grpo_loss, loss_stats_to_metrics
from grpolab.algo.metric_reduction import (
    FALLBACK,
    PER_METRIC,
    RULES,
    WEIGHT_NAMES,
    Rule,
    explicit_rule,
    pack,
    reduce_metrics,
    rule_for,
    step_weights,
    unpack,
)


def test_doctests():
    assert doctest.testmod(red).failed == 0


def _batch(seed: int, rows: int, groups_from: int) -> dict[str, torch.Tensor]:
    """One rank's rows: whole groups of 4, uneven completion lengths, a NaN (unscorable) reward, an off-policy
    sampler so the ratios are not 1."""
    g = torch.Generator().manual_seed(seed)
    t = 7
    lengths = torch.randint(1, t + 1, (rows,), generator=g)
    cmask = torch.arange(t)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 2, (rows,), generator=g).float()
    rewards[1] = math.nan
    group_ids = torch.arange(groups_from, groups_from + rows // 4).repeat_interleave(4)
    summary = group_reward_summary(rewards, group_ids)
    zero_std = summary["zero_std"][torch.searchsorted(summary["group_ids"], group_ids)]
    loss_mask = cmask & ~zero_std[:, None] & ~torch.isnan(rewards)[:, None]
    logp = -torch.rand(rows, t, generator=g) * 3
    return {"cmask": cmask, "loss_mask": loss_mask.float(), "rewards": rewards, "group_ids": group_ids,
            "zero_std": zero_std, "logp": logp, "sampler": logp + 0.3 * torch.randn(rows, t, generator=g),
            "ref": logp + 0.1 * torch.randn(rows, t, generator=g), "entropy": torch.rand(rows, t, generator=g),
            "advantages": torch.randn(rows, generator=g), "std": torch.rand(rows, generator=g)}


def _metrics(b: dict[str, torch.Tensor]) -> tuple[dict[str, float], dict[str, float]]:
    """What GRPOModule._log_step computes from these rows (the same functions), and its weights."""
    valid = ~torch.isnan(b["rewards"])
    summary = group_reward_summary(b["rewards"], b["group_ids"])
    mask = b["loss_mask"].bool()
    _, stats = grpo_loss(b["logp"], b["sampler"], b["logp"], b["advantages"], b["loss_mask"],
                         LossConfig(beta=0.04), 1.0, b["ref"])
    m = {"reward": float(b["rewards"][valid].mean()), "reward_std": float(summary["std"].mean()),
         "frac_zero_std/all_wrong": float(summary["all_wrong"].float().mean()),
         "frac_unscorable": float((~valid).float().mean()),
         "entropy": float(masked_mean(b["entropy"], b["cmask"].float())),
         "completions/mean_length": float(b["cmask"].sum(1).float().mean()),
         **loss_stats_to_metrics(stats)}
    div = policy_sampler_divergence(b["logp"], b["sampler"], mask)
    m.update({k: float(v) for k, v in div.items() if k != "num_sequences"})
    seq = mask.any(1)
    cw = c_weight(b["std"], 1e-4)
    m["c_weight/mean"], m["c_weight/max"] = float(cw.mean()), float(cw.max())
    m["c_weight/unmasked_mean"] = float(cw[seq & ~b["zero_std"]].mean())
    m["surrogate"] = float(surrogate(((b["logp"] - b["sampler"]) * mask).sum(1), b["advantages"], seq))
    weights = step_weights(b["cmask"], b["loss_mask"], b["rewards"], b["group_ids"], b["zero_std"],
                           stats["grad_weight_sum"])
    return {f"train/{k}": v for k, v in m.items()}, weights


def test_ranks_combined_equal_the_pooled_batch():
    ranks = [_batch(0, 12, 0), _batch(1, 8, 100)]  # different sizes, token counts and rewards
    pooled = {k: torch.cat([r[k] for r in ranks]) for k in ranks[0]}
    per_rank = [_metrics(r) for r in ranks]
    got = reduce_metrics([m for m, _ in per_rank], [w for _, w in per_rank])
    expected, _ = _metrics(pooled)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    # the check has teeth: rank 0's own values (what was logged before) and the plain mean of ranks are off
    assert per_rank[0][0]["train/reward"] != pytest.approx(expected["train/reward"], rel=1e-3)
    plain = sum(m["train/entropy"] for m, _ in per_rank) / 2
    assert plain != pytest.approx(expected["train/entropy"], rel=1e-3)


def test_counts_add_up_extremes_skip_ranks_without_data_and_nan_propagates():
    metrics = [{"train/num_tokens": 10.0, "train/ratio/max": 1.0, "train/ratio/min": 1.0, "train/loss": 2.0,
                "train/lower_bound": math.nan, "train/rewards/fmt/mean": 0.0},
               {"train/num_tokens": 5.0, "train/ratio/max": 0.7, "train/ratio/min": 0.5, "train/loss": 1.0,
                "train/lower_bound": math.nan, "train/rewards/fmt/mean": 0.5}]
    weights = [{**dict.fromkeys(WEIGHT_NAMES, 1.0), "loss_tokens": 0.0, "train/rewards/fmt/mean": 0.0},
               {**dict.fromkeys(WEIGHT_NAMES, 1.0), "loss_tokens": 3.0, "train/rewards/fmt/mean": 2.0}]
    out = reduce_metrics(metrics, weights)
    assert out["train/num_tokens"] == 15.0
    # rank 0 had no loss token: its 1.0 is a placeholder, not a ratio
    assert out["train/ratio/max"] == 0.7 and out["train/ratio/min"] == 0.5
    assert out["train/loss"] == 1.5  # plain mean over ranks (DDP averages the ranks' gradients)
    assert math.isnan(out["train/lower_bound"])
    assert out["train/rewards/fmt/mean"] == 0.5  # weighted by the rows the function scored
    # every rank without data: the placeholder stays
    out = reduce_metrics(metrics[:1], weights[:1])
    assert out["train/ratio/max"] == 1.0


def test_pack_unpack_round_trip_and_mismatched_names_are_refused():
    a = pack({"train/b": 2.5, "train/a": math.inf}, {"rows": 4.0})
    b = pack({"train/b": 1.0, "train/a": -1.0}, {"rows": 2.0})
    ms, ws = unpack(torch.stack([a, b]), ["train/a", "train/b"], ["rows"])
    assert ms == [{"train/a": math.inf, "train/b": 2.5}, {"train/a": -1.0, "train/b": 1.0}]
    assert ws == [{"rows": 4.0}, {"rows": 2.0}]
    other = pack({"train/b": 1.0, "train/c": -1.0}, {"rows": 2.0})  # same length, other names
    with pytest.raises(ValueError, match=r"ranks \[1\] logged other step metrics"):
        unpack(torch.stack([a, other]), ["train/a", "train/b"], ["rows"])
    with pytest.raises(ValueError, match="which the step did not report"):
        reduce_metrics([{"train/reward": 1.0}], [{"rows": 1.0}])


def test_rule_table_resolution_and_weights():
    assert rule_for("train/lag") == Rule("max") and rule_for("train/lag/max") == Rule("max")
    assert rule_for("train/lower_bound/c_tv") == rule_for("train/lower_bound") == Rule("mean", "loss_groups")
    assert rule_for("train/ratio/anchor_q99") == Rule("mean", "loss_tokens")
    assert rule_for("train/ratio/anchor_max") == Rule("max", "loss_tokens")  # exact name over the q* prefix
    assert rule_for("train/time/rollout") == Rule("max")
    assert rule_for("train/clip_ratio/low_mean") == Rule("mean", "loss_tokens")  # the more literal pattern
    # a registered loss variant's own stats as loss_stats_to_metrics names them
    assert rule_for("train/my_penalty_mean") == Rule("mean", "loss_tokens")
    assert rule_for("train/my_penalty_max") == Rule("max", "loss_tokens")
    assert rule_for("train/my_penalty_min") == Rule("min", "loss_tokens")
    assert rule_for("train/log_ratio_seq_mean") == Rule("mean", "loss_sequences")  # exact name over a pattern
    assert explicit_rule("train/something_new") is None and rule_for("train/something_new") == FALLBACK
    assert FALLBACK == Rule("mean", "rows")
    assert {r.weight for r in RULES.values()} <= {*WEIGHT_NAMES, PER_METRIC, None}
    with pytest.raises(ValueError, match="Rule.op"):
        Rule("median")


def test_step_weights_counts():
    b = _batch(0, 8, 0)
    w = step_weights(b["cmask"], b["loss_mask"], b["rewards"], b["group_ids"], b["zero_std"], None)
    assert set(w) == set(WEIGHT_NAMES)
    assert w["rows"] == 8 and w["scored_rows"] == 7 and w["groups"] == 2 and w["grad_weight"] == 0.0
    assert w["completion_tokens"] == float(b["cmask"].sum()) and w["loss_tokens"] == float(b["loss_mask"].sum())
    with pytest.raises(ValueError, match="same rows"):
        step_weights(b["cmask"], b["loss_mask"][:3], b["rewards"], b["group_ids"], b["zero_std"])
