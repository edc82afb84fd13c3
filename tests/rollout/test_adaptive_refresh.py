"""rollout.refresh=adaptive (the old spelling of rollout/refresh=drift): the sampler is refreshed early once the measured drift passes rollout.max_drift,
the refresh steps reach summary.json, a bound never reached changes nothing, and resume is exact."""

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import run_training
from grpolab.config import GRPOConfig
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine
from grpolab.rollout.settings import RolloutConfig

# k = 4, a learning rate high enough for the tiny random model to drift measurably within a buffer
COMMON = [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=4", "algo.learning_rate=1e-2",
          *varied(), "trainer.val_check_interval=100", "val.at_start=false"]


def _run(out, *overrides):
    summary = run_training(compose_train_cfg(out, [*COMMON, *overrides]))
    return summary, pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"])


def test_a_bound_never_reached_is_the_step_schedule_and_a_tiny_bound_refreshes_every_step(tmp_path):
    steps, steps_metrics = _run(tmp_path / "steps", "trainer.max_steps=6")
    never, never_metrics = _run(tmp_path / "never", "trainer.max_steps=6", "rollout.refresh=adaptive",
                                "rollout.max_drift=100.0")
    assert never["drift_refreshes"] == 0 and never["sampler_refreshes"] == steps["sampler_refreshes"] == 2
    assert never_metrics["train/loss"].tolist() == steps_metrics["train/loss"].tolist()  # the same maths
    # drift is measured from the second step of a buffer on (the first trains at lag 0: drift 0)
    assert never_metrics["train/rollout/drift"].notna().sum() >= 4
    tiny, tiny_metrics = _run(tmp_path / "tiny", "trainer.max_steps=6", "rollout.refresh=adaptive",
                              "rollout.max_drift=1e-12")
    # A buffer's first step trains at lag 0 (drift exactly 0: no refresh). Step 0's learning rate is 0 (warm-up),
    # so step 1 (lag 1) still measures 0; step 2 measures a drift > 0 and step 3 refreshes. From then on every
    # lag-1 step drifts: the next buffer serves 2 steps (3, 4) and step 5 refreshes.
    assert tiny["drift_refresh_steps"] == [3, 5] and tiny["sampler_refreshes"] == 3
    assert tiny["unused_minibatches"] == 1 + 2  # of each ended buffer's 4 minibatches
    assert tiny_metrics["train/lag"].tolist() == [0, 1, 2, 0, 1, 0]


def test_adaptive_resume_is_exact(tmp_path):
    common = ["rollout.refresh=adaptive", "rollout.max_drift=0.02", "trainer.max_steps=8",
              "callbacks.model_checkpoint.every_n_train_steps=3", "callbacks.model_checkpoint.monitor=null",
              "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'"]
    full, _ = _run(tmp_path / "full", *common)
    ckpt = tmp_path / "full" / "checkpoints" / "step3.ckpt"
    resumed, _ = _run(tmp_path / "resumed", *common, f"ckpt_path={ckpt}")
    assert resumed["drift_refresh_steps"] == full["drift_refresh_steps"]
    assert resumed["sampler_refreshes"] == full["sampler_refreshes"]
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "policy").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("settings,algo,match", [
    (dict(refresh="adaptive"), dict(steps_per_generation=4), "needs rollout.max_drift"),
    (dict(refresh="adaptive", max_drift=0.1), dict(steps_per_generation=1), "steps_per_generation >= 2"),
    (dict(max_drift=0.1), dict(steps_per_generation=4), "read by rollout.refresh=adaptive only"),
    (dict(refresh="drift"), dict(), r"rollout.refresh=drift: choose refresh rules with rollout/refresh=\[drift\]"),
])
def test_adaptive_settings_are_checked_naming_the_key(settings, algo, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**settings).validate(GRPOConfig(**algo), HFSamplerCopyEngine)
