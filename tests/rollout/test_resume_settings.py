"""Resuming with settings that shape the saved rollout buffer changed.

A checkpoint inside a buffer (k = 3, saved at step 1) holds two more minibatches sampled with the old
settings. Resuming with another num_generations / steps_per_generation is refused with the list of
changed keys, unless ``resume_drop_buffer=true`` drops the saved buffer.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training

COMMON = ["algo=grpo_offpolicy", "algo.steps_per_generation=3", "trainer.val_check_interval=100",
          "val.at_start=false", "callbacks.model_checkpoint.every_n_train_steps=1",
          "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
          "callbacks.model_checkpoint.filename='step{step}'", "save_policy=false"]


@pytest.fixture(scope="module")
def mid_buffer_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("first")
    run_training(compose_train_cfg(out, [*FAST_OVERRIDES, *COMMON, "trainer.max_steps=1"]))
    ckpt = out / "checkpoints" / "step1.ckpt"
    state = torch.load(ckpt, weights_only=False)
    (dm_state,) = [v for k, v in state.items() if k == "RolloutDataModule"]
    assert len(dm_state["buffer"]) == 3 and dm_state["position"] == 1  # saved inside the buffer
    assert dm_state["settings"]["num_generations"] == 4 and dm_state["settings"]["steps_per_generation"] == 3
    return ckpt


@pytest.mark.parametrize(
    "changes,listed",
    [
        (["algo.num_generations=2"], ["algo.num_generations: 4 -> 2"]),
        (["algo.steps_per_generation=2"], ["algo.steps_per_generation: 3 -> 2"]),
        (["algo.num_generations=2", "algo.max_completion_length=4"],
         ["algo.num_generations: 4 -> 2", "algo.max_completion_length: 6 -> 4"]),
    ],
)
def test_changed_buffer_settings_are_refused_with_the_list(tmp_path, mid_buffer_ckpt, changes, listed):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, *changes, "trainer.max_steps=3",
                                       f"ckpt_path={mid_buffer_ckpt}"])
    with pytest.raises(ValueError, match="resume_drop_buffer=true") as err:
        run_training(cfg)
    for item in listed:
        assert item in str(err.value)


def test_resume_drop_buffer_samples_a_new_buffer(tmp_path, mid_buffer_ckpt):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, "algo.num_generations=2", "trainer.max_steps=3",
                                       f"ckpt_path={mid_buffer_ckpt}", "resume_drop_buffer=true"])
    summary = run_training(cfg)
    # 1 refresh before the checkpoint + 1 new one right at resume (the old buffer's 2 minibatches dropped).
    assert summary["steps"] == 3 and summary["sampler_refreshes"] == 2


def test_unchanged_settings_resume_as_before(tmp_path, mid_buffer_ckpt):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, "trainer.max_steps=3", f"ckpt_path={mid_buffer_ckpt}",
                                       "algo.learning_rate=5e-5"])  # not a buffer setting
    summary = run_training(cfg)
    assert summary["steps"] == 3 and summary["sampler_refreshes"] == 1  # the saved buffer was used up


def test_a_resume_the_buffer_cannot_serve_is_refused_before_any_model(tmp_path, mid_buffer_ckpt):
    # the data module's state is read from the checkpoint by preflight, before Lightning or a model is touched
    from grpolab.app.preflight import DATAMODULE_STATE_KEY, preflight
    from grpolab.rollout.datamodule import RolloutDataModule

    assert DATAMODULE_STATE_KEY == RolloutDataModule.__qualname__  # the key Lightning saves the state under
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, "algo.num_generations=2", "trainer.max_steps=3",
                                       f"ckpt_path={mid_buffer_ckpt}"])
    with pytest.raises(ValueError, match="algo.num_generations: 4 -> 2"):
        preflight(cfg)
    # another process count while the saved buffer has steps left: each rank held its own prompts' buffer
    ddp = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, "trainer=ddp", "trainer.max_steps=3",
                                       f"ckpt_path={mid_buffer_ckpt}"])
    with pytest.raises(ValueError, match="rank buffers in the checkpoint: 1, processes now: 2"):
        preflight(ddp)
    preflight(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *COMMON, "trainer=ddp", "trainer.max_steps=3",
                                           f"ckpt_path={mid_buffer_ckpt}", "resume_drop_buffer=true"]))
