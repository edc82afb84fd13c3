"""The stale-samples rerun's two stages (pre-registered in docs/results/stale_samples.md) compose as written:
stage 1 (sweeps/stale_tune.yaml) tunes lr on the validation split only, on its own warm start and seeds; stage 2
(sweeps/stale_headline.yaml) scores the test split at 3 warm starts x 5 seeds, each arm at its own tuned lr. The
configs are composed and checked, not run."""

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationToMissingValueError
from test_sweeps_notebook import compose_sweep, grid

from grpolab.config import GRPOConfig
from grpolab.rollout.settings import resolve_rollout

TUNE_ARMS = ["onpolicy", "grpo_async", "onpolicy_prev_window", "k4_ppo", "k10_ppo", "k10_offpolicy_grpo"]
HEAD_ARMS = ["onpolicy", "grpo_async", "onpolicy_prev_window"]
LRS = {"tuned_lr.onpolicy": 1e-4, "tuned_lr.grpo_async": 5e-5, "tuned_lr.onpolicy_prev_window": 2.5e-5}
# arm -> (k, clip_mode, ratio_reference, async)
EXPECTED = {"onpolicy": (1, "ppo", "sampler", False), "grpo_async": (1, "ppo", "sampler", True),
            "onpolicy_prev_window": (1, "ppo", "previous", False), "k4_ppo": (4, "ppo", "sampler", False),
            "k10_ppo": (10, "ppo", "sampler", False), "k10_offpolicy_grpo": (10, "offpolicy_grpo", "sampler", False)}


def _algo(cfg):
    HydraConfig.instance().set_config(cfg)  # as in a job: ${hydra:runtime.choices.correction_arm} resolves
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    _, _, settings = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    return algo, settings


def test_tuning_selects_on_val_with_its_own_warm_start_and_seeds():
    tune, head = compose_sweep("stale_tune", []), compose_sweep("stale_headline", [])
    assert grid(tune) == {"correction_arm": TUNE_ARMS, "algo.learning_rate": ["2.5e-5", "5e-5", "1e-4"],
                          "seed": ["100", "101", "102"]}
    assert grid(head) == {"correction_arm": HEAD_ARMS, "model.warmstart.seed": ["0", "1", "2"],
                          "seed": ["0", "1", "2", "3", "4"]}
    assert tune.final_eval.split == "val" and head.final_eval.split == "test"  # the test split scores stage 2 only
    assert tune.model.warmstart.seed == 3 and not set(grid(tune)["seed"]) & set(grid(head)["seed"])
    for cfg in (tune, head):  # one split for both stages, so stage 2's test prompts were never tuned on
        assert cfg.data.val_size == 1024 and cfg.data.test_size == 1024 and cfg.data.seed == 0
        assert cfg.val.max_prompts == 64 and cfg.final_eval.num_samples == 16 and cfg.final_eval.enabled
        assert cfg.trainer.max_steps == 1000 and cfg.callbacks.threads.num_threads == 1


@pytest.mark.parametrize("task", [[], ["data=multistep"]])
@pytest.mark.parametrize("arm", TUNE_ARMS)
def test_each_tuning_arm_is_its_setting_and_passes_the_checks(arm, task):
    cfg = compose_sweep("stale_tune", [f"correction_arm={arm}", "algo.learning_rate=2.5e-5", "seed=101", *task])
    algo, settings = _algo(cfg)
    assert (algo.steps_per_generation, algo.clip_mode, algo.ratio_reference, settings.async_generation) == EXPECTED[arm]
    assert algo.learning_rate == 2.5e-5 and algo.num_iterations == 1
    assert cfg.data.val_size == 1024 and cfg.final_eval.split == "val"
    if task:
        assert cfg.data._target_.endswith("MultiStepArithmeticTask")


@pytest.mark.parametrize("task", [[], ["data=multistep"]])
@pytest.mark.parametrize("arm", HEAD_ARMS)
def test_each_headline_arm_trains_at_its_own_tuned_lr(arm, task):
    cfg = compose_sweep("stale_headline", [f"correction_arm={arm}", "model.warmstart.seed=2", "seed=4", *task,
                                           *(f"{k}={v}" for k, v in LRS.items())])
    algo, settings = _algo(cfg)
    assert (algo.steps_per_generation, algo.clip_mode, algo.ratio_reference, settings.async_generation) == EXPECTED[arm]
    assert algo.learning_rate == LRS[f"tuned_lr.{arm}"] and cfg.model.warmstart.seed == 2
    assert cfg.data.val_size == 1024 and cfg.final_eval.split == "test"


def test_a_missing_tuned_lr_names_its_key():
    cfg = compose_sweep("stale_headline", ["correction_arm=onpolicy_prev_window", "tuned_lr.onpolicy=1e-4"])
    with pytest.raises(InterpolationToMissingValueError, match="tuned_lr.onpolicy_prev_window"):
        _algo(cfg)
