"""A sampler that dies loses nothing: last.ckpt at the last completed step, summary.json marked failed with the
reason, one line and the resume command from src/train.py, and a resume that ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.run import run_training

HERE = Path(__file__).resolve().parent
COMMON = [*FAST_OVERRIDES, "val.at_start=false", "trainer.val_check_interval=1000",
          "callbacks.completions.every_n_steps=1000", "final_eval.enabled=false", "trainer.max_steps=4"]
FAILING = ["rollout._target_=failing_engine.FailingHFEngine", "+rollout.fail_at_call=3"]  # refill before step 3


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


def test_train_py_prints_one_line_with_the_resume_command_and_exits_1(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(HERE)]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "src" / "train.py"), *COMMON, *FAILING,
                          f"hydra.run.dir={tmp_path}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    line = [x for x in out.stderr.splitlines() if x.startswith("train.py: error:")]
    assert len(line) == 1 and "after step 2" in line[0] and "engine died" in line[0]
    assert f"ckpt_path={tmp_path / 'checkpoints' / 'last.ckpt'}" in line[0] and "trainer.max_steps=4" in line[0]
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "summary.json").exists()
