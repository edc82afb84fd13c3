"""The claim sweeps compose into the one-factor-at-a-time grid around the paper's k=10 setting, and
every job ends with a final held-out mean@16."""

import pytest
from omegaconf import OmegaConf
from test_sweeps_notebook import compose_sweep, grid

from grpolab.config import GRPOConfig

# arm -> (k, clip_mode, ratio_reference, mask, cap, learning rate)
CLAIM_ARMS = {
    "k1": (1, "ppo", "sampler", False, None, 1e-4),
    "k2": (2, "offpolicy_grpo", "sampler", True, None, 1e-4),
    "k4": (4, "offpolicy_grpo", "sampler", True, None, 1e-4),
    "k10": (10, "offpolicy_grpo", "sampler", True, None, 1e-4),
    "k10_ppo": (10, "ppo", "sampler", True, None, 1e-4),
    "k10_anchor": (10, "offpolicy_grpo", "anchor", True, None, 1e-4),
    "k10_nomask": (10, "offpolicy_grpo", "sampler", False, None, 1e-4),
    "k10_cap": (10, "offpolicy_grpo", "sampler", True, 2.0, 1e-4),
    "k1_lowlr": (1, "ppo", "sampler", False, None, 5e-5),
    "k10_lowlr": (10, "offpolicy_grpo", "sampler", True, None, 5e-5),
}
SMALL_ARMS = ["k1", "k10", "k10_ppo", "k10_anchor", "k10_nomask", "k10_cap"]


@pytest.mark.parametrize("name,arms,steps", [("claim", list(CLAIM_ARMS), 1000), ("claim_small", SMALL_ARMS, 400)])
def test_claim_grid(name, arms, steps):
    cfg = compose_sweep(name, [])
    assert grid(cfg) == {"arm": arms, "seed": ["0", "1", "2"]}
    assert cfg.task_name == name and cfg.trainer.max_steps == steps
    assert cfg.final_eval.enabled and cfg.final_eval.num_samples == 16 and cfg.final_eval.split == "test"
    assert cfg.data.test_size == 1024  # mean@16 on 1024 prompts: a standard error of about one point
    assert cfg.model.seed == 0 and cfg.data.seed == 0 and cfg.callbacks.threads.num_threads == 1


@pytest.mark.parametrize("arm", list(CLAIM_ARMS))
def test_each_claim_arm_changes_one_factor(arm):
    cfg = compose_sweep("claim", [f"arm={arm}", "seed=1"])
    a = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    got = (a.steps_per_generation, a.clip_mode, a.ratio_reference, a.mask_zero_std_groups, a.importance_weight_cap,
           a.learning_rate)
    assert got == CLAIM_ARMS[arm]
    assert a.num_iterations == 1 and a.importance_sampling_level == "token" and cfg.seed == 1


def test_multistep_task_composes_with_the_claim_sweep():
    cfg = compose_sweep("claim_small", ["data=multistep", "arm=k10"])
    assert cfg.data._target_.endswith("MultiStepArithmeticTask") and cfg.algo.max_completion_length == 16
    assert cfg.algo.steps_per_generation == 10 and cfg.data.test_size == 1024
