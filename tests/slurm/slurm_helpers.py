"""Helpers of the tests on a real SLURM cluster (scripts/slurm_local.sh start): submit ``python src/train.py`` with
``sbatch``/``srun``/Hydra's submitit launcher, wait for jobs, read their state from ``scontrol``.

Without a cluster that answers, the tests skip with one line; with ``GRPOLAB_SLURM=1`` (set by .ci/run after it
starts the cluster) a missing cluster fails them instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT

# "plnd": the backfill scheduler has planned a pending job on the node (a requeued one, say): it is up and will
# take it (seen as a flake: the node read "plnd" between two tests and 4 failed as "no node takes jobs")
READY_STATES = ("idle", "mix", "alloc", "comp", "plnd")
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def cluster_problem() -> str | None:
    """None when a SLURM controller answers and its node takes jobs; else why not, in one line."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return "SLURM client commands (sbatch, sinfo) are not installed"
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo got no answer within 20 s"
    states = res.stdout.split()
    if res.returncode != 0 or not any(s.rstrip("*~#-") in READY_STATES for s in states):
        return f"no SLURM node takes jobs ({(res.stderr or res.stdout).strip()[:120] or 'no nodes'})"
    return None


def require_cluster() -> None:
    """Skip (or, with ``GRPOLAB_SLURM=1``, fail) the test when no cluster answers."""
    problem = cluster_problem()
    if problem is None:
        return
    msg = f"{problem}: start one with `sudo scripts/slurm_local.sh start`"
    if os.environ.get("GRPOLAB_SLURM") == "1":
        pytest.fail(f"GRPOLAB_SLURM=1 but {msg}", pytrace=False)
    pytest.skip(msg)


def train_cmd(*overrides: str) -> list[str]:
    """``python src/train.py`` with the fast test overrides (an override replaces a fast one of the same key)."""
    keys = {o.split("=")[0] for o in overrides}
    fast = [o for o in FAST_OVERRIDES if o.split("=")[0] not in keys]
    return [sys.executable, str(REPO_ROOT / "src" / "train.py"), *fast, *overrides]


def sbatch(script: str, folder: Path, *flags: str) -> str:
    """Submit a batch ``script`` (its body, without the shebang) from ``folder``; returns the job id."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.sh"
    path.write_text("#!/bin/bash\n" + script + "\n")
    res = subprocess.run(["sbatch", "--parsable", "--open-mode=append", f"--output={folder}/slurm-%j.out",
                          "--ntasks=1", "--cpus-per-task=1", *flags, str(path)],
                         cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def job_info(job: str) -> dict[str, str]:
    """``scontrol show job -o <job>`` as a dict (JobState, Restarts, ExitCode, ...); {} once SLURM forgot it."""
    res = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        return {}
    return dict(kv.split("=", 1) for kv in res.stdout.split() if "=" in kv)


def wait_job(job: str, timeout: float = 240, release: bool = True) -> dict[str, str]:
    """Wait until ``job`` ends; a job requeued (pending on SLURM's ~2 minutes' BeginTime hold) is released at once
    with ``scontrol update StartTime=now`` when ``release``. Returns its last :func:`job_info`."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    final_since: float | None = None
    while time.monotonic() < deadline:
        info = job_info(job) or info
        state = info.get("JobState", "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            # a job that requeues itself can read FAILED for a moment (its step was cancelled by the requeue) before
            # slurmctld puts it back to PENDING: an end counts once it has held for 3 s
            final_since = final_since or time.monotonic()
            if time.monotonic() - final_since >= 3.0:
                return info
            time.sleep(0.5)
            continue
        final_since = None
        if release and state == "PENDING" and info.get("Reason") == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True, timeout=30)
        time.sleep(0.5)
    subprocess.run(["scancel", job], capture_output=True, timeout=30)
    raise AssertionError(f"job {job} did not end within {timeout} s: {info}")


def wait_sweep_job(sweep, folder: Path, rows: int, name: str, timeout: float = 180) -> tuple[Path, str]:
    """Wait until job 0 of the sweep command ``sweep`` (a Popen; the sweep folder ``folder``, the job name ``name``)
    has written more than ``rows`` lines of its metrics.csv; return its run folder and its SLURM job id.

    Raises:
        AssertionError: the sweep command ended first (with its output's end), or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while not (found := list(folder.glob("0_*/metrics.csv"))) or len(found[0].read_text().splitlines()) <= rows:
        assert sweep.poll() is None, sweep.communicate(timeout=60)[0][-3000:]
        assert time.monotonic() < deadline, f"no training steps within {timeout} s"
        time.sleep(0.1)
    job = job_named(name)
    assert job, f"no job named {name} in squeue, though its run trains"
    return found[0].parent, job


def job_named(name: str, state: str | None = None) -> str:
    """The id of the first job ``squeue`` lists by the name ``name`` (in ``state``, when given), else ""."""
    listed = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True, text=True,
                            timeout=30).stdout.split()
    return next((job for job, _, st in (line.partition("|") for line in listed) if state in (None, st)), "")
