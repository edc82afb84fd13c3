"""The end-of-training held-out evaluation (final_eval) and the weight statistics of a real run."""

import json
from math import comb

import pandas as pd
import pytest
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import build, run_training


def test_final_eval_writes_mean_at_n_with_stderr_and_per_prompt(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=2",
                                       "algo.importance_weight_cap=2.0", "trainer.max_steps=2",
                                       "trainer.val_check_interval=2", *varied(),
                                       "final_eval.enabled=true", "final_eval.num_samples=4",
                                       "final_eval.batch_size=5", "final_eval.ks=[1,2]"])
    summary = run_training(cfg)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["importance_weight_cap"] == 2.0
    final = json.loads((tmp_path / "final_eval.json").read_text())
    assert summary["test_num_prompts"] == 16 == len(final["per_prompt"])  # data.test_size=16, all prompts
    fractions = list(final["per_prompt"].values())
    assert all(f in (0.0, 0.25, 0.5, 0.75, 1.0) for f in fractions)  # 4 samples per prompt
    assert on_disk["test_mean_at_4"] == pytest.approx(sum(fractions) / 16)
    mean = sum(fractions) / 16
    se = (sum((f - mean) ** 2 for f in fractions) / 15 / 16) ** 0.5  # over prompts, ddof 1
    assert on_disk["test_mean_at_4_se"] == pytest.approx(se)
    assert "test_greedy_accuracy" in on_disk and on_disk["final_eval_s"] >= 0
    # pass@k for final_eval.ks and n (issue 42): the unbiased estimator 1 - C(n-c, k) / C(n, k) per prompt, by hand
    for k in (1, 2, 4):
        by_hand = sum(1 - comb(4 - round(4 * f), k) / comb(4, k) for f in fractions) / 16
        assert on_disk[f"test_pass_at_{k}"] == pytest.approx(by_hand), k
    assert on_disk["test_pass_at_1"] == pytest.approx(on_disk["test_mean_at_4"])
    assert on_disk["test_pass_at_1"] <= on_disk["test_pass_at_2"] <= on_disk["test_pass_at_4"]
    # training: 2 steps x 8; validation at start and end: 8 prompts x (2 sampled + 1 greedy); neither counts the
    # final evaluation's 16 x (4 + 1)
    assert summary["completions"] == 2 * 8 and summary["val_completions"] == 2 * 8 * 3
    metrics = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    for col in ("train/ratio/anchor_max", "train/ratio/anchor_q50", "train/ratio/anchor_q99",
                "train/ratio/anchor_frac_above_2", "train/ratio/grad_weight_frac_above_2"):
        assert metrics[col].notna().all(), col
    assert (metrics["train/ratio/max"] <= 2.0 + 0.2 + 1e-4).all()  # capped weights stay within c + eps


def test_final_eval_with_a_sampler_that_owns_a_copy(tmp_path):
    # rollout=hf_copy: the training sampler holds a stale copy; the final score comes from the live policy's
    # validation producer and still covers every test prompt
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "rollout=hf_copy", "algo=grpo_offpolicy",
                                       "algo.steps_per_generation=2", "trainer.max_steps=2", "val.at_start=false",
                                       "final_eval.enabled=true", "final_eval.num_samples=2"])
    summary = run_training(cfg)
    assert summary["test_num_prompts"] == 16 and 0.0 <= summary["test_mean_at_2"] <= 1.0


def test_final_eval_off_by_default(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=1", "val.at_start=false"])
    summary = run_training(cfg)
    assert not (tmp_path / "final_eval.json").exists() and "test_mean_at_16" not in summary


@pytest.mark.parametrize("override,key", [("final_eval.num_samples=0", "final_eval.num_samples"),
                                          ("final_eval.split=dev", "final_eval.split"),
                                          ("final_eval.enabled=abc", "final_eval.enabled"),
                                          ("final_eval.ks=[2,32]", "final_eval.ks"), ("final_eval.ks=4", "final_eval.ks"),
                                          ("algo.importance_weight_cap=0.5", "algo.importance_weight_cap")])
def test_bad_final_eval_or_cap_fails_before_any_model(tmp_path, override, key):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo=grpo_offpolicy", "final_eval.enabled=true", override])
    with pytest.raises(ValueError, match=key):
        build(cfg)
