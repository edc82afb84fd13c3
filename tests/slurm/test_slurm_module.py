"""grpolab/app/slurm.py without a cluster: which signals requeue, which id is requeued, which checkpoint a requeued
job resumes from (SLURM's environment variables set as SLURM sets them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT
from omegaconf import OmegaConf

from grpolab.app import slurm


@pytest.fixture
def no_slurm(monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _cfg(tmp_path, ckpt_path=None):
    return OmegaConf.create({"ckpt_path": ckpt_path, "paths": {"output_dir": str(tmp_path)},
                             "callbacks": {"model_checkpoint": {"dirpath": str(tmp_path / "checkpoints")}}})


def test_usr1_and_usr2_requeue_only_inside_a_slurm_job(no_slurm):
    assert slurm.requeue_signals() == ()
    assert slurm.requeue(signal.SIGUSR1) is False  # outside SLURM: nothing to requeue
    no_slurm.setenv("SLURM_JOB_ID", "41")
    assert slurm.requeue_signals() == (signal.SIGUSR1, signal.SIGUSR2)
    assert slurm.requeue(signal.SIGINT) is False and slurm.requeue(None) is False  # Ctrl-C never requeues
    no_slurm.setenv("SLURM_PROCID", "1")
    assert slurm.requeue(signal.SIGUSR1) is False  # only rank 0 asks SLURM


def test_the_requeued_id_of_an_array_task_is_array_underscore_task(no_slurm):
    assert slurm.job_id() is None
    no_slurm.setenv("SLURM_JOB_ID", "57")
    assert slurm.job_id() == "57"
    no_slurm.setenv("SLURM_ARRAY_JOB_ID", "55")
    no_slurm.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert slurm.job_id() == "55_2"


def _ckpt(path: Path, step: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step}, path)
    return path


def test_a_requeued_job_resumes_from_its_own_last_ckpt_and_nothing_else(no_slurm, tmp_path):
    cfg = _cfg(tmp_path)
    ckpt = _ckpt(tmp_path / "checkpoints" / "last.ckpt", 12)
    assert slurm.resume_after_requeue(cfg).ckpt_path is None  # a first start (no SLURM_RESTART_COUNT)
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm.resume_after_requeue(cfg).ckpt_path == str(ckpt)
    ckpt.unlink()  # requeued before any checkpoint: start from scratch
    assert slurm.resume_after_requeue(_cfg(tmp_path)).ckpt_path is None


def test_a_job_started_from_ckpt_path_and_requeued_resumes_from_its_own_progress(no_slurm, tmp_path):
    """Issue 39 item 3: ``ckpt_path=`` names where the job started; after a requeue its own ``last.ckpt`` is
    further on, and resuming from the original would train the allocation's steps again (for ever, for a job
    longer than one allocation)."""
    start = _ckpt(tmp_path / "elsewhere" / "step10.ckpt", 10)
    no_slurm.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm.resume_after_requeue(_cfg(tmp_path, ckpt_path=str(start))).ckpt_path == str(start)  # none of its own
    own = _ckpt(tmp_path / "checkpoints" / "last.ckpt", 25)
    assert slurm.resume_after_requeue(_cfg(tmp_path, ckpt_path=str(start))).ckpt_path == str(own)
    _ckpt(start, 40)  # a given checkpoint further on than a stale last.ckpt in the folder: the given one
    assert slurm.resume_after_requeue(_cfg(tmp_path, ckpt_path=str(start))).ckpt_path == str(start)
    assert slurm.resume_after_requeue(_cfg(tmp_path, ckpt_path=str(own))).ckpt_path == str(own)  # a rerun set it


def test_a_requeued_single_run_keeps_its_first_allocations_metrics_rows(no_slurm, tmp_path):
    """Issue 39 item 4: Lightning's CSV logger starts ``metrics.csv`` anew in the requeued allocation; the rows
    before the checkpoint are set aside and put back in front of the new ones (rows after it are logged again)."""
    from grpolab.app.run_folder import RunFolder

    _ckpt(tmp_path / "checkpoints" / "last.ckpt", 3)
    rows = ["step,train/loss,val/accuracy", "0,,0.25", *(f"{s},0.{s},"for s in range(5))]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    slurm.resume_after_requeue(_cfg(tmp_path))
    assert not (tmp_path / "metrics.csv").exists()
    (tmp_path / "metrics.csv").write_text("step,train/loss\n3,0.3\n4,0.4\n")  # the second allocation's logger
    RunFolder(tmp_path).stitch_metrics()  # src/train.py, when the run ends
    got = (tmp_path / "metrics.csv").read_text().splitlines()
    assert got == ["step,train/loss,val/accuracy", "0,,0.25", "0,0.0,", "1,0.1,", "2,0.2,", "3,0.3,", "4,0.4,"]


# A stand-in for `scontrol` as SLURM behaves when it takes `scontrol requeue` from inside the job: every task of the job
# gets SIGTERM at once (the caller and scontrol itself) while scontrol is still returning its answer.
_SCONTROL_KILLED_BY_ITS_REQUEUE = """#!/bin/sh
kill -TERM $PPID
kill -TERM $$
echo "requeued $2"
"""
_REQUEUE_IN_A_JOB = """
import logging, signal, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from grpolab.app import slurm
print("returned", slurm.requeue(signal.SIGUSR1), flush=True)
"""


def _fake_scontrol(folder: Path, script: str) -> dict:
    folder.mkdir(exist_ok=True)
    (folder / "scontrol").write_text(script)
    (folder / "scontrol").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "81",
            "SLURM_PROCID": "0", "PYTHONPATH": str(Path(slurm.__file__).parents[2])}


def test_the_sigterm_that_slurm_answers_a_requeue_with_does_not_cut_scontrol_or_the_run(tmp_path):
    """SLURM ends the job's tasks as soon as it takes the requeue, scontrol included: the run must read scontrol's
    answer and end by itself with its log written (before: both died by SIGTERM mid-call, or scontrol's death read
    as a failed requeue)."""
    env = _fake_scontrol(tmp_path / "bin", _SCONTROL_KILLED_BY_ITS_REQUEUE)
    res = subprocess.run([sys.executable, "-c", _REQUEUE_IN_A_JOB], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    assert "SLURM job 81 requeued" in res.stdout and "returned True" in res.stdout, res.stdout


def test_a_failed_requeue_gives_sigterm_its_handler_back(no_slurm, tmp_path):
    env = _fake_scontrol(tmp_path / "bin", "#!/bin/sh\necho 'Requested operation is presently disabled' >&2\nexit 1\n")
    no_slurm.setenv("PATH", env["PATH"])
    no_slurm.setenv("SLURM_JOB_ID", "81")
    before = signal.getsignal(signal.SIGTERM)
    assert slurm.requeue(signal.SIGUSR2) is False
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_requeued_job_without_its_last_ckpt_says_it_starts_over(no_slurm, tmp_path, caplog):
    no_slurm.setenv("SLURM_JOB_ID", "90")
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    with caplog.at_level("WARNING", logger="grpolab.app.slurm"):
        assert slurm.resume_after_requeue(_cfg(tmp_path / "a_new_timestamped_folder")).ckpt_path is None
    assert "requeued (restart 1), but its run folder" in caplog.text and "hydra.run.dir=" in caplog.text


def test_hydras_max_num_timeout_caps_our_requeues(no_slurm, tmp_path):
    """submitit's hydra.launcher.max_num_timeout used to bind only submitit's own requeues."""
    from hydra.core.hydra_config import HydraConfig

    env = _fake_scontrol(tmp_path / "bin", "#!/bin/sh\necho called >> \"$(dirname \"$0\")/calls\"\n")
    no_slurm.setenv("PATH", env["PATH"])
    no_slurm.setenv("SLURM_JOB_ID", "91")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=slurm", "hydra.launcher.max_num_timeout=2"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        assert slurm.max_requeues() == 2
        no_slurm.setenv("SLURM_RESTART_COUNT", "1")
        assert slurm.will_requeue(signal.SIGUSR2) and not slurm.will_requeue(signal.SIGTERM)
        no_slurm.setenv("SLURM_RESTART_COUNT", "2")
        assert not slurm.will_requeue(signal.SIGUSR2)
        assert slurm.requeue(signal.SIGUSR2) is False and not (tmp_path / "bin" / "calls").exists()
    finally:
        HydraConfig.instance().cfg = None
    assert slurm.max_requeues() is None
