"""Helpers of the 2-process training tests: launch ``python src/train.py`` as a user does (Lightning re-launches it
once per extra rank), with the rank audit callback (rank_audit.py) recording what each rank trained on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkrun
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, REPO_ROOT

STEPS, G = 3, 4
COMMON = ["trainer.devices=2", "algo.loss_type=dapo", f"trainer.max_steps={STEPS}", "algo.micro_batch_size=4",
          *varied(), "algo.learning_rate=1e-3", f"algo.num_generations={G}", "algo.beta=0.04",
          "+callbacks.audit._target_=rank_audit.RankAudit"]


def train(out: Path, *overrides: str, timeout: int = 150) -> subprocess.CompletedProcess:
    """Run src/train.py in a fresh process (Lightning re-launches it once per extra rank)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(Path(__file__).parent),
                                                    str(REPO_ROOT / "tests")]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "GRPOLAB_CACHE": str(out / "cache")}
    cmd = [sys.executable, str(REPO_ROOT / "src" / "train.py"), *FAST_OVERRIDES, f"hydra.run.dir={out}",
           f"+callbacks.audit.out={out / 'audit'}", *overrides]
    return forkrun.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _weights(out: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out / "audit" / f"rank{rank}.pt")
