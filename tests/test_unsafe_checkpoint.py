"""A checkpoint is data: a crafted ``.ckpt`` whose pickle calls a function never runs it, at any entry point that
reads ``ckpt_path`` (the resume checks of ``src/train.py``, ``src/eval.py``); our own checkpoints still load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT

from grpolab.config_checks import check_resume_steps, load_checkpoint
from grpolab.errors import ConfigError


class _RunsCommand:
    """Unpickling this calls ``os.system(command)``: what an attacker's checkpoint would do."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _crafted(tmp: Path) -> tuple[Path, Path]:
    marker = tmp / "code_ran"
    path = tmp / "evil.ckpt"
    torch.save({"global_step": 1, "state_dict": {}, "payload": _RunsCommand(f"touch {marker}")}, path)
    return path, marker


def test_check_resume_steps_refuses_a_checkpoint_that_runs_code(tmp_path):
    path, marker = _crafted(tmp_path)
    with pytest.raises(ConfigError, match="refused to load") as err:
        check_resume_steps(path, max_steps=10)
    assert str(path) in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("script", ["src/train.py", "src/eval.py"])
def test_entry_points_refuse_a_checkpoint_that_runs_code(tmp_path, script):
    path, marker = _crafted(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("GRPOLAB_TRACEBACK", None)
    overrides = FAST_OVERRIDES if script == "src/train.py" else [o for o in FAST_OVERRIDES if o.startswith("model.")]
    cmd = [sys.executable, script, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'run'}",
           f"paths.cache_dir={tmp_path / 'cache'}", *overrides]
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert not marker.exists(), "the checkpoint's pickle ran a command"
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "refused to load" in last and str(path) in last


def test_our_own_checkpoint_loads_safely(tmp_path):
    """A real checkpoint of a 2-step run loads under weights_only (its step and weights are there)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    run = tmp_path / "run"
    cmd = [sys.executable, "src/train.py", "trainer.max_steps=2", "val.at_start=false", f"hydra.run.dir={run}",
           f"paths.cache_dir={tmp_path / 'cache'}", *FAST_OVERRIDES]
    subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True, timeout=300, env=env)
    ckpt = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2
    assert any(k.startswith("policy.") for k in ckpt["state_dict"])
    assert check_resume_steps(run / "checkpoints" / "last.ckpt", max_steps=3) == 2
