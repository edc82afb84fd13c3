"""Preemption on a real SLURM cluster: a job signalled mid-run (``scancel --signal=USR1``, as ``--signal=USR1@<s>``
does before the time limit; or ``scontrol requeue``, SIGTERM, as preemption) saves last.ckpt at the step boundary,
goes back to the queue, resumes from its own folder's last.ckpt and ends with the uninterrupted run's weights and
metrics. A job that fails for a real error is not requeued."""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import time
import uuid
from pathlib import Path

import forkrun
import pytest
import torch
from conftest import REPO_ROOT
from safetensors.torch import load_file
from slurm_helpers import ENV, job_info, require_cluster, sbatch, train_cmd, wait_job, wait_sweep_job

pytestmark = pytest.mark.slow  # minutes of SLURM round trips: started first under -n auto

TOTAL = 30
COMMON = ["val.at_start=false", "trainer.val_check_interval=1000", "callbacks.completions.every_n_steps=1000",
          f"trainer.max_steps={TOTAL}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run, outside SLURM."""
    out = tmp_path_factory.mktemp("slurm_requeue") / "reference"
    res = forkrun.run(train_cmd(*COMMON, f"hydra.run.dir={out}"), cwd=REPO_ROOT, env=ENV, capture_output=True,
                      text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _wait_rows(metrics: Path, job: str, rows: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) > rows):
        assert job_info(job).get("JobState") in ("PENDING", "RUNNING"), job_info(job)
        assert time.monotonic() < deadline, f"no {rows} training steps within {timeout} s"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["scancel_usr1", "scontrol_requeue"])
def test_a_job_preempted_mid_run_requeues_resumes_and_ends_as_the_uninterrupted_run(tmp_path, reference, how):
    require_cluster()
    run = tmp_path / "run"  # the job's own folder, the same after the requeue
    job = sbatch("srun " + shlex.join(train_cmd(*COMMON, f"hydra.run.dir={run}")), tmp_path,
                 "--job-name=grpolab_requeue")
    _wait_rows(run / "metrics.csv", job, rows=3)
    if how == "scancel_usr1":  # the warning --signal=USR1@<s> sends: the run requeues itself
        subprocess.run(["scancel", "--signal=USR1", job], check=True, timeout=30)
    else:  # SLURM requeues (SIGTERM to the job's tasks, as on preemption)
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    info = wait_job(job)
    log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, log[-3000:])
    assert "resuming from" in log and "last.ckpt" in log, log[-3000:]
    if how == "scancel_usr1":
        assert "SIGUSR1: SLURM job" in log and "requeued" in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    ref = json.loads((reference / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["steps"] == TOTAL
    for key in ("val_accuracy_end", "val_greedy_accuracy_end", "completions"):
        assert summary[key] == ref[key], key
    got, want = load_file(run / "policy" / "model.safetensors"), load_file(reference / "policy" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # every step's metrics row survives the requeue, once (issue 39 item 4: the first allocation's rows were lost)
    assert _step_rows(run / "metrics.csv") == _step_rows(reference / "metrics.csv")


def _step_rows(metrics: Path) -> list[tuple[int, str]]:
    """(step, train/grad_norm) of each training row of a ``metrics.csv``."""
    with metrics.open(newline="") as fh:
        return [(int(float(r["step"])), r["train/grad_norm"]) for r in csv.DictReader(fh) if r.get("train/grad_norm")]


def test_a_job_that_fails_for_a_config_error_is_not_requeued(tmp_path):
    require_cluster()
    job = sbatch("srun " + shlex.join(train_cmd("algo.epsilonn=0.3")), tmp_path, "--job-name=grpolab_fail")
    info = wait_job(job, timeout=120, release=False)
    log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", (info, log[-2000:])
    assert "train.py: error: algo.epsilonn" in log, log[-2000:]


def test_a_multirun_job_signalled_by_submitits_usr2_requeues_and_the_sweep_ends_complete(tmp_path, reference):
    """``hydra/launcher=slurm``: the USR2 Hydra's submitit launcher asks for before the time limit stops the job at a
    step boundary, it requeues itself, resumes in the same sweep folder, and the sweep command ends with the
    uninterrupted run's weights."""
    require_cluster()
    # a name no other job has: test sessions side by side share the cluster and tmp_path's name is the same in each
    # (one session's USR2 went to another session's job, which had resumed and finished: it then read FAILED, 140)
    name = f"grpolab_usr2_{uuid.uuid4().hex[:12]}"
    cmd = train_cmd("hydra/launcher=slurm", *COMMON, "seed=0", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                    f"hydra.launcher.name={name}")
    cmd.insert(2, "-m")
    sweep = forkrun.Popen(cmd, cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run, job = wait_sweep_job(sweep, tmp_path / "sweep", 3, name)
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        info = wait_job(job)
        output = sweep.communicate(timeout=120)[0]
    finally:
        if sweep.poll() is None:
            sweep.kill()
        subprocess.run(["scancel", "-n", name], capture_output=True, timeout=30)  # none left holding the node
    assert sweep.returncode == 0 and info["Restarts"] == "1", (info, output[-3000:])
    log = "".join(p.read_text() for p in (tmp_path / "sweep" / ".submitit").glob("*/*_log.out"))
    assert "SIGUSR2: SLURM job" in log and "resuming from" in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["steps"] == TOTAL
    got, want = load_file(run / "policy" / "model.safetensors"), load_file(reference / "policy" / "model.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in want)
