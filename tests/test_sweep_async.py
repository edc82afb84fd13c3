"""The async sweep (sweeps/async.yaml): its configs compose into the intended grid of regimes."""

import pytest
from omegaconf import OmegaConf
from test_sweeps_notebook import compose_sweep, grid

from grpolab.config import GRPOConfig
from grpolab.rollout.settings import split_rollout_config

ARMS = {  # arm -> (k, i, async, rollout engine)
    "k1": (1, 1, False, "HFGenerationEngine"),
    "k1_async": (1, 1, True, "HFSamplerCopyEngine"),
    "k10": (10, 1, False, "HFGenerationEngine"),
    "k10_async": (10, 1, True, "HFSamplerCopyEngine"),
    "k10_async_ppo": (10, 1, True, "HFSamplerCopyEngine"),
    "reuse_i10": (1, 10, False, "HFGenerationEngine"),
}


def test_async_sweep_grid():
    cfg = compose_sweep("async", [])
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.task_name == "async"
    assert grid(cfg) == {"async_arm": list(ARMS), "seed": ["0", "1", "2"]}
    assert cfg.trainer.max_steps == 1000 and "threads" not in cfg.callbacks  # every arm on all cores


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_async_arm_selects_its_regime(arm):
    cfg = compose_sweep("async", [f"async_arm={arm}", "seed=1"])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    engine, settings = split_rollout_config(OmegaConf.to_container(cfg.rollout, resolve=True))
    k, i, is_async, engine_name = ARMS[arm]
    assert (algo.steps_per_generation, algo.num_iterations, settings.async_generation) == (k, i, is_async)
    assert engine["_target_"].endswith(engine_name) and cfg.seed == 1
