"""algo.skip_zero_grad_steps: a step whose gradient is exactly zero (every loss token masked) leaves the weights
alone; without it AdamW's momentum keeps moving them (the multistep collapse in docs/results/stale_samples.md)."""

import pandas as pd
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import run_training

# k=3 with a token mask band so narrow that only lag-0 tokens (ratio exactly 1) pass: the steps at lag 1 and 2
# of each window have every token masked, so their gradient is exactly 0.
MASK_ALL_STALE = ["algo=grpo_offpolicy", "algo.steps_per_generation=3", "algo.clip_mode=token_is_mask",
                  "algo.is_mask_low=0.999999", "algo.is_mask_high=1.000001", "algo.learning_rate=1e-2",
                  "rollout.recompute_sampler_logp=true",  # log alpha from the trainer: lag-0 ratios exactly 1
                  *varied(),  # rewards that differ within groups from step 0 (a gradient)
                  "trainer.val_check_interval=100", "val.at_start=false"]


def _run(path, skip, steps):
    summary = run_training(compose_train_cfg(path, [*FAST_OVERRIDES, *MASK_ALL_STALE, f"trainer.max_steps={steps}",
                                                    f"algo.skip_zero_grad_steps={skip}"]))
    grad_norm = pd.read_csv(path / "metrics.csv").dropna(subset=["train/grad_norm"])["train/grad_norm"].tolist()
    return summary, grad_norm, AutoModelForCausalLM.from_pretrained(path / "policy").state_dict()


def test_a_zero_gradient_step_moves_the_weights_only_without_skipping(tmp_path):
    two, norms_two, w_two = _run(tmp_path / "two", True, 2)
    skip, norms, w_skip = _run(tmp_path / "skip", True, 3)
    step, norms_step, w_step = _run(tmp_path / "step", False, 3)
    # the setting above gives a gradient at steps 0 and 1 and none at step 2 (every token of it masked)
    assert norms[:2] == norms_two and min(norms[:2]) > 0 and norms[2] == 0.0 and norms_step == norms
    assert skip["steps"] == 3 and skip["skipped_optimizer_steps"] == 1 and two["skipped_optimizer_steps"] == 0
    assert all(torch.equal(w_two[k], w_skip[k]) for k in w_two)  # skipped: the weights of step 1 kept
    # stepped anyway: AdamW repeats a decayed copy of its momentum on a zero gradient
    assert step["skipped_optimizer_steps"] == 0 and not all(torch.equal(w_two[k], w_step[k]) for k in w_two)
