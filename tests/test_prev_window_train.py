"""algo=grpo_onpolicy_prev_window trains end to end: step 0's ratio is 1 with nothing clipped, later steps' ratio
pi/pi_{t-1} moves and the window binds; the previous step's weights are in the checkpoint, so a resumed run ends
with the uninterrupted run's weights (and without them it would not)."""

import pandas as pd
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import run_training

# epsilon 0.01: a window narrow enough to bind on a few-step run of the small random model
COMMON = ["algo=grpo_onpolicy_prev_window", *varied(), "algo.learning_rate=1e-3",
          "algo.epsilon=0.01", "trainer.val_check_interval=100", "val.at_start=false",
          "callbacks.model_checkpoint.every_n_train_steps=2", "callbacks.model_checkpoint.monitor=null",
          "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'"]


def _run(out, *overrides):
    summary = run_training(compose_train_cfg(out, [*FAST_OVERRIDES, *COMMON, *overrides]))
    return summary, pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"])


def _weights(out):
    return AutoModelForCausalLM.from_pretrained(out / "policy").state_dict()


def test_prev_window_trains_binds_and_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    summary, train = _run(full, "trainer.max_steps=5")
    assert summary["steps"] == 5 and summary["algo"] == "grpo_onpolicy_prev_window"
    assert train["train/lag"].tolist() == [0] * 5  # synchronous on-policy sampling
    first = train.iloc[0]
    assert first["train/ratio/mean"] == 1.0 and first["train/clip_ratio/region_mean"] == 0.0  # pi_{-1} := pi_0
    # the warm-up's learning rate is 0 at step 0, so pi_1 = pi_0: the ratio moves from step 2 on
    assert train["train/ratio/mean"].iloc[1] == 1.0
    later = train.iloc[2:]
    assert (later["train/ratio/mean"] != 1.0).all()
    assert later["train/clip_ratio/region_mean"].max() > 0  # the window on pi/pi_{t-1} binds
    assert (train["train/ratio/anchor_mean"] == 1.0).all()  # pi_k / alpha: still on-policy

    ckpt = full / "checkpoints" / "step2.ckpt"
    resumed = tmp_path / "resumed"
    summary, _ = _run(resumed, "trainer.max_steps=5", f"ckpt_path={ckpt}")
    assert summary["steps"] == 5
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)

    # the previous weights matter: a checkpoint without them (pi_{t-1} := pi_t at resume) ends elsewhere
    state = torch.load(ckpt, weights_only=False)
    assert "previous_policy" in state["grpolab"]
    del state["grpolab"]["previous_policy"]
    stripped = tmp_path / "stripped.ckpt"
    torch.save(state, stripped)
    lost = tmp_path / "lost"
    _run(lost, "trainer.max_steps=5", f"ckpt_path={stripped}")
    c = _weights(lost)
    assert not all(torch.equal(a[k], c[k]) for k in a)
