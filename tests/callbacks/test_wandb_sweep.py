"""W&B runs carry the sweep's shape (conf/logger/wandb.yaml, grpolab/callbacks/wandb_logger.py): group = the sweep,
job_type = the arm (the overrides minus seed), tags = the overrides; checked on a real offline W&B run."""

from __future__ import annotations

from conftest import compose_train_cfg
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import open_dict, read_write

from grpolab.callbacks.wandb_logger import sweep_metadata


def _multirun_job(tmp_path, overrides):
    cfg = compose_train_cfg(tmp_path, ["logger=wandb", *overrides])
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path / "screen1")
    HydraConfig.instance().set_config(cfg)
    return cfg


def test_an_offline_wandb_run_carries_group_job_type_and_override_tags(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _multirun_job(tmp_path, ["seed=2", "algo=grpo_offpolicy", "algo.epsilon=0.3", "paths.cache_dir=/tmp/c"])
    try:
        run = instantiate(cfg.logger.wandb).experiment
        assert run.offline and run.group == "train-screen1"
        assert run.job_type == "algo.epsilon=0.3,algo=grpo_offpolicy"  # the arm: sorted, no seed, no path
        tags = list(run.tags)
        assert tags[0] == "algo=grpo_offpolicy" and tags[4] == "seed=2"  # auto tags first (algo, k, i, mask, seed)
        assert "algo.epsilon=0.3" in tags and not any(t.startswith("paths.") for t in tags)
        # the other seed of the same arm: same group and job_type, so a dashboard groups them together
        other = sweep_metadata(_multirun_job(tmp_path, ["seed=3", "algo=grpo_offpolicy", "algo.epsilon=0.3"]).hydra,
                               "train")
        assert (other["group"], other["job_type"]) == (run.group, run.job_type)
    finally:
        wandb.finish()


def test_long_arms_are_cut_and_stay_distinct(tmp_path):
    a = sweep_metadata(_multirun_job(tmp_path, ["algo.epsilon=0.1", "algo.epsilon_high=0.30000000000000004",
                                                "algo.learning_rate=0.00001", "algo.beta=0.0"]).hydra, "train")
    b = sweep_metadata(_multirun_job(tmp_path, ["algo.epsilon=0.1", "algo.epsilon_high=0.30000000000000004",
                                                "algo.learning_rate=0.00001", "algo.beta=0.1"]).hydra, "train")
    assert len(a["job_type"]) <= 64 and len(b["job_type"]) <= 64 and a["job_type"] != b["job_type"]
    assert sweep_metadata(_multirun_job(tmp_path, ["seed=1"]).hydra, "train")["job_type"] == "default"
