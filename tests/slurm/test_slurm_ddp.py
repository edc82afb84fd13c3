"""A 2-task DDP job started by ``srun`` on a real SLURM cluster: 2 gloo processes on CPU set up by Lightning's
SLURMEnvironment (no process launched by Lightning), ending with the same weights and metrics as the same run
started by Lightning's own launcher (``python src/train.py trainer=ddp``)."""

from __future__ import annotations

import json
import os
import subprocess

import forkrun
import pytest
import torch
from conftest import REPO_ROOT
from safetensors.torch import load_file
from slurm_helpers import ENV, require_cluster, train_cmd

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="2 CPU processes need 2 cores")]

DDP = ["trainer=ddp", "trainer.devices=2", "trainer.max_steps=3", "algo.loss_type=dapo", "algo.micro_batch_size=4",
       "val.at_start=false", "algo.learning_rate=1e-3"]


def test_a_two_task_srun_job_trains_as_lightnings_own_ddp_launcher(tmp_path):
    require_cluster()
    lightning, slurm = tmp_path / "lightning", tmp_path / "slurm"
    res = forkrun.run(train_cmd(*DDP, f"hydra.run.dir={lightning}"), cwd=REPO_ROOT, env=ENV, capture_output=True,
                      text=True, timeout=240)  # rank 0 forked; Lightning starts rank 1 as a real process
    assert res.returncode == 0, res.stderr[-3000:]
    # --ntasks-per-node = trainer.devices (Lightning's SLURMEnvironment refuses a bare --ntasks)
    srun = ["srun", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--kill-on-bad-exit=1",
            "--job-name=grpolab_ddp",
            *train_cmd(*DDP, f"hydra.run.dir={slurm}")]
    res = subprocess.run(srun, cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    # SLURM started both ranks: Lightning launched no process of its own (its launcher logs to train_ddp_process_1)
    assert (lightning / "train_ddp_process_1.log").exists() and not (slurm / "train_ddp_process_1.log").exists()
    got, want = (json.loads((p / "summary.json").read_text()) for p in (slurm, lightning))
    assert got["world_size"] == want["world_size"] == 2 and got["steps"] == want["steps"] == 3
    for key in ("val_accuracy_end", "val_greedy_accuracy_end", "completions", "unscorable", "truncated"):
        assert got[key] == want[key], key
    a, b = (load_file(p / "policy" / "model.safetensors") for p in (slurm, lightning))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b)
