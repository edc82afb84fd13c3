"""grpolab/slurm.py without a cluster: which signals requeue, which id is requeued, which checkpoint a requeued
job resumes from (SLURM's environment variables set as SLURM sets them)."""

from __future__ import annotations

import signal

import pytest
from omegaconf import OmegaConf

from grpolab import slurm


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


def test_a_requeued_job_resumes_from_its_own_last_ckpt_and_nothing_else(no_slurm, tmp_path):
    cfg = _cfg(tmp_path)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x")
    assert slurm.resume_after_requeue(cfg).ckpt_path is None  # a first start (no SLURM_RESTART_COUNT)
    no_slurm.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm.resume_after_requeue(cfg).ckpt_path == str(ckpt)
    explicit = _cfg(tmp_path, ckpt_path="/elsewhere/step10.ckpt")  # the user's ckpt_path wins
    assert slurm.resume_after_requeue(explicit).ckpt_path == "/elsewhere/step10.ckpt"
    ckpt.unlink()  # requeued before any checkpoint: start from scratch
    assert slurm.resume_after_requeue(_cfg(tmp_path)).ckpt_path is None
