"""rollout.refresh=adaptive under rollout.async_generation: when the drift of the buffer being served passes
rollout.max_drift, the trainer takes the buffer in flight and the sampler takes the current weights at once.
Decisions are taken at step boundaries from the logged drift, so runs are reproducible and resume exactly."""

import math

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import build, run_training
from grpolab.errors import ConfigError

# k = 4 with asynchronous generation (lag 4..7 after the first buffer), rewards that vary within every group by
# design (tests/certain_reward.py) and a learning rate high enough for the tiny random model to drift by about 1e-2
# per step; a lag-0 minibatch, or one after step 0 (learning rate 0), measures round-off only (under 1e-6). The bound
# sits orders of magnitude from both, so which steps pass it is the schedule's logic, not the processor's rounding.
BOUND = 1e-4
COMMON = [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=4", "algo.learning_rate=1e-2",
          *varied(), "trainer.val_check_interval=100", "val.at_start=false",
          "rollout=hf_copy", "rollout.async_generation=true", "trainer.max_steps=10"]
ADAPTIVE = ["rollout.refresh=adaptive", f"rollout.max_drift={BOUND}"]
CHECKPOINTS = ["callbacks.model_checkpoint.every_n_train_steps=5", "callbacks.model_checkpoint.monitor=null",
               "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'"]
NOT_TIMING = ["train/lag", "train/loss", "train/reward", "train/tv_token", "train/rollout/drift",
              "train/rollout/drift_refreshes"]


def _run(out, *overrides):
    summary = run_training(compose_train_cfg(out, [*COMMON, *overrides]))
    return summary, pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)


def _same_weights(a, b):
    wa = AutoModelForCausalLM.from_pretrained(a / "policy").state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b / "policy").state_dict()
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_async_adaptive_refresh_takes_the_buffer_in_flight_and_new_weights(tmp_path):
    steps, steps_metrics = _run(tmp_path / "steps")
    assert steps_metrics["train/lag"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 4, 5]  # buffer 1 from step 0's weights
    never, never_metrics = _run(tmp_path / "never", "rollout.refresh=adaptive", "rollout.max_drift=100.0")
    assert never["drift_refreshes"] == 0
    assert never_metrics["train/loss"].tolist() == steps_metrics["train/loss"].tolist()  # the same maths
    summary, metrics = _run(tmp_path / "adaptive", *ADAPTIVE)
    drift, lag = metrics["train/rollout/drift"], metrics["train/lag"].tolist()
    refreshed = [s for s in range(1, 10) if drift[s] > BOUND]
    # the rule read the logged drift of the step before: a refresh at every step whose drift passed the bound
    assert summary["drift_refresh_steps"] == refreshed == [3, 4, 5, 6, 7, 9]
    assert all(math.isnan(d) or d <= BOUND for s, d in enumerate(drift) if s not in refreshed)
    assert metrics["train/rollout/drift_refreshes"].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 5, 6]
    # step 3: buffer 0 ends and the trainer takes buffer 1 (in flight, step 0's weights: lag 3); the sampler takes
    # step 3's weights for buffer 2, served from step 4 at lag 1, and so on. At step 7 no buffer is in flight (the
    # one served from step 6 would have reached max_steps): buffer 6 is sampled now, from step 7's weights; step 9
    # ends it in the same way.
    assert lag == [0, 1, 2, 3, 1, 1, 1, 0, 1, 0]
    assert summary["sampler_refreshes"] == 7 and summary["unused_minibatches"] == 1 + 3 + 3 + 3 + 3 + 2
    assert summary["weight_syncs"] == 6  # pushes at steps 0 (buffers 0 and 1), 3, 4, 5, 7 and 9
    again, again_metrics = _run(tmp_path / "again", *ADAPTIVE)  # reproducible bit for bit
    pd.testing.assert_frame_equal(metrics[NOT_TIMING], again_metrics[NOT_TIMING])
    assert _same_weights(tmp_path / "adaptive", tmp_path / "again")


def test_async_adaptive_resume_mid_buffer_is_exact(tmp_path):
    full_summary, full = _run(tmp_path / "full", *ADAPTIVE, *CHECKPOINTS)
    ckpt = tmp_path / "full" / "checkpoints" / "step5.ckpt"
    state = torch.load(ckpt, weights_only=False)["RolloutDataModule"]
    # after step 4: one minibatch of the buffer sampled at step 3 trained, the next buffer in flight from step 4
    assert state["position"] == 1 and state["in_flight"]["policy_version"] == 4
    assert state["refresh_rules"]["drift"]["steps"] == [3, 4]
    summary, resumed = _run(tmp_path / "resumed", *ADAPTIVE, *CHECKPOINTS, f"ckpt_path={ckpt}")
    for key in ("drift_refresh_steps", "sampler_refreshes", "unused_minibatches", "weight_syncs", "completions"):
        assert summary[key] == full_summary[key], key
    pd.testing.assert_frame_equal(full[NOT_TIMING].iloc[5:].reset_index(drop=True), resumed[NOT_TIMING])
    assert _same_weights(tmp_path / "full", tmp_path / "resumed")


@pytest.mark.parametrize("overrides,message", [
    (["rollout.refresh=adaptive"], r"rollout\.refresh=adaptive needs rollout\.max_drift"),
    (["rollout.refresh=adaptive", "rollout.max_drift=0.05", "algo.steps_per_generation=1"],
     r"algo\.steps_per_generation >= 2"),
    (["rollout.max_drift=0.05"], r"rollout\.max_drift is read by rollout\.refresh=adaptive only"),
    (["rollout.refresh=adaptive", "rollout.max_drift=-1"], r"rollout\.max_drift, a number > 0"),
])
def test_async_adaptive_settings_are_config_errors_before_any_model(tmp_path, overrides, message):
    cfg = compose_train_cfg(tmp_path, [*COMMON, *overrides])
    with pytest.raises(ConfigError, match=message):
        build(cfg)
    assert not (tmp_path / "cache").exists()  # nothing was built
