"""A sampler that dies loses nothing: last.ckpt at the last completed step, summary.json marked failed with the
reason, one line and the resume command from src/train.py, and a resume that ends where an uninterrupted run ends;
the same under rollout.async_generation=true; and a sampler that can be restarted is, the run ending exactly where
an uninterrupted one ends."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import forkrun
import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.run import run_training

HERE = Path(__file__).resolve().parent
COMMON = [*FAST_OVERRIDES, "val.at_start=false", "trainer.val_check_interval=1000",
          "callbacks.completions.every_n_steps=1000", "final_eval.enabled=false", "trainer.max_steps=4",
          *varied(), "algo.learning_rate=1e-3"]  # rewards that differ: the policy moves every step
FAILING = ["rollout._target_=failing_engine.FailingHFEngine", "+rollout.fail_at_call=3"]  # refill before step 3
ASYNC = ["rollout=hf_copy", "rollout.async_generation=true"]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    return {k: v for k, v in state.items() if "policy" in k}


def test_an_engine_error_saves_the_last_step_and_the_resume_matches_an_uninterrupted_run(tmp_path):
    full = run_training(compose_train_cfg(tmp_path / "full", COMMON))
    assert full["failed"] is False and full["steps"] == 4
    failed_dir = tmp_path / "failed"
    failed = run_training(compose_train_cfg(failed_dir, [*COMMON, *FAILING]))
    assert failed["failed"] is True and failed["steps"] == 2
    assert failed["failure"]["step"] == 2 and "engine died" in failed["failure"]["reason"]
    ckpt = failed_dir / "checkpoints" / "last.ckpt"
    assert failed["failure"]["ckpt_path"] == str(ckpt) and ckpt.exists()
    assert json.loads((failed_dir / "summary.json").read_text())["failed"] is True
    resumed = run_training(compose_train_cfg(tmp_path / "resumed", [*COMMON, f"ckpt_path={ckpt}"]))
    assert resumed["steps"] == 4 and resumed["failed"] is False
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 4
    for k, v in a["state_dict"].items():
        assert torch.equal(v, b["state_dict"][k]), k


def _same_checkpoint_weights(a: Path, b: Path) -> None:
    sa, sb = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    assert sa["global_step"] == sb["global_step"]
    for k, v in sa["state_dict"].items():
        assert torch.equal(v, sb["state_dict"][k]), k


def test_an_async_sampler_failure_takes_the_same_path_and_the_resume_matches(tmp_path):
    # the background job of buffer 2 raises: the failure surfaces at the step boundary that needs it, as a
    # SamplerFailure (a failed summary, not a traceback), with last.ckpt at the last completed step holding buffer 2
    # in flight; the resume regenerates it from the saved sampler weights and ends where an uninterrupted run ends
    full = run_training(compose_train_cfg(tmp_path / "full", [*COMMON, *ASYNC]))
    assert full["failed"] is False and full["steps"] == 4
    failed_dir = tmp_path / "failed"
    failed = run_training(compose_train_cfg(failed_dir, [*COMMON, *ASYNC, "rollout._target_=failing_engine."
                                                         "FailingCopyEngine", "+rollout.fail_at_call=3"]))
    assert failed["failed"] is True and 0 < failed["steps"] == failed["failure"]["step"] < 4
    reason = failed["failure"]["reason"]
    assert reason.startswith("RolloutEngineError: step ") and "rollout buffer 2" in reason and "engine died" in reason
    ckpt = failed_dir / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["global_step"] == failed["steps"] and state["RolloutDataModule"]["in_flight"]["round"] == 2
    resumed = run_training(compose_train_cfg(tmp_path / "resumed", [*COMMON, *ASYNC, f"ckpt_path={ckpt}"]))
    assert resumed["steps"] == 4 and resumed["failed"] is False and resumed["completions"] == full["completions"]
    _same_checkpoint_weights(tmp_path / "full" / "checkpoints" / "last.ckpt",
                             tmp_path / "resumed" / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize("schedule", [[], ASYNC[1:]], ids=["sync", "async"])
def test_a_restarted_sampler_resamples_the_failed_buffer_from_the_same_weights(tmp_path, schedule):
    # the sampler dies (losing its weights) on buffer 2 and is restarted: the buffer is sampled again from the
    # weights of its refresh (async: the launch's push, not the live policy, which trained meanwhile), so the run
    # ends bit for bit where an uninterrupted run ends; one restart in the summary and the step metric
    common = [*COMMON, "rollout=hf_copy", *schedule]
    full = run_training(compose_train_cfg(tmp_path / "full", common))
    run = run_training(compose_train_cfg(tmp_path / "restarted", [
        *common, "rollout._target_=failing_engine.RestartingCopyEngine", "+rollout.fail_at_call=3"]))
    assert run["failed"] is False and run["steps"] == 4 and run["sampler_restarts"] == 1 and full["sampler_restarts"] == 0
    assert run["completions"] == full["completions"] and run["weight_syncs"] == full["weight_syncs"] + 1
    # the refill before step 2 (sync), the step-2 boundary that needs buffer 2 (async, launched at step 1)
    restarts = pd.read_csv(tmp_path / "restarted" / "metrics.csv")["train/rollout/sampler_restarts"].dropna()
    assert restarts.tolist() == [0, 0, 1, 1]
    _same_checkpoint_weights(tmp_path / "full" / "checkpoints" / "last.ckpt",
                             tmp_path / "restarted" / "checkpoints" / "last.ckpt")


def test_a_sampler_with_no_restart_left_fails_naming_why(tmp_path):
    run = run_training(compose_train_cfg(tmp_path, [*COMMON, "rollout=hf_copy", "rollout._target_=failing_engine."
                                                    "RestartingCopyEngine", "+rollout.fail_at_call=3",
                                                    "+rollout.max_restarts=0"]))
    assert run["failed"] is True and run["sampler_restarts"] == 0 and run["steps"] == 2
    assert run["failure"]["reason"].startswith("not restarted again (0 of 0 used): SamplerDied: ")


@pytest.mark.parametrize("failing", [FAILING, [*ASYNC, "rollout._target_=failing_engine.FailingCopyEngine",
                                                "+rollout.fail_at_call=3"]], ids=["sync", "async"])
def test_train_py_prints_one_line_with_the_resume_command_and_exits_1(tmp_path, failing):
    # async: the background sampler's error surfaces at the step-2 boundary, the same one line (no traceback)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(HERE), str(REPO_ROOT / "tests")]),
           "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    tag = 'tags=["first try"]'  # a value with a space: the printed command must quote it for the shell
    out = forkrun.run([sys.executable, str(REPO_ROOT / "src" / "train.py"), *COMMON, *failing, tag,
                          f"hydra.run.dir={tmp_path}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    line = [x for x in out.stderr.splitlines() if x.startswith("train.py: error:")]
    assert len(line) == 1 and "after step 2" in line[0] and "engine died" in line[0]
    assert f"ckpt_path={tmp_path / 'checkpoints' / 'last.ckpt'}" in line[0] and "trainer.max_steps=4" in line[0]
    command = shlex.split(line[0].split("resume with: ", 1)[1].split(" (summary.json", 1)[0])
    assert command[:2] == ["python", "src/train.py"] and tag in command and "trainer.max_steps=4" in command
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "summary.json").exists()
