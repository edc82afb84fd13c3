"""A multirun job folder's identity and owner (grpolab/run_identity.py): a folder trained under other settings is
never taken as the same job, and a job running in one process is not started again by a second rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg
from omegaconf import open_dict
from test_sweep_resume import ENV, _cmd, _trained

from grpolab.run_identity import IDENTITY, NotThisJob, RunFolderBusy, claim, differing_keys, settings
from grpolab.sweep_resume import job_state


def _cfg(tmp_path, *overrides):
    cfg = compose_train_cfg(tmp_path / "job", [*FAST_OVERRIDES, *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "job")
    return cfg


def test_settings_leave_out_paths_loggers_and_the_cache_but_not_the_weights(tmp_path):
    base = settings(_cfg(tmp_path))
    assert "model.path" in base and "algo.learning_rate" in base and "seed" in base
    assert not [k for k in base if k.startswith(("paths.", "logger.", "callbacks.")) or k == "ckpt_path"]
    assert "model.cache_dir" not in base and "trainer.default_root_dir" not in base  # ${paths.*}: where, not what
    same = settings(_cfg(tmp_path, "trainer.enable_progress_bar=true", "logger=tensorboard", "ckpt_path=/x.ckpt"))
    assert differing_keys(base, same) == []
    other = settings(_cfg(tmp_path, "model.path=/elsewhere/policy", "seed=3"))
    assert differing_keys(base, other) == ["model.path", "model.seed", "seed"]  # model.seed: ${seed}


def test_a_folder_trained_with_other_settings_is_refused_naming_the_keys(tmp_path):
    with claim(_cfg(tmp_path)):
        pass
    recorded = json.loads((tmp_path / "job" / IDENTITY).read_text())
    assert recorded["settings"]["model.path"] is None
    with claim(_cfg(tmp_path, "logger=tensorboard")):  # the same job: taken
        pass
    with pytest.raises(NotThisJob, match=r"other settings \(model\.path=None there, /w/policy now\)"), \
            claim(_cfg(tmp_path, "model.path=/w/policy")):
        pass
    assert json.loads((tmp_path / "job" / IDENTITY).read_text()) == recorded  # the record is kept


def test_a_job_running_in_one_process_is_not_started_by_another(tmp_path):
    (tmp_path / "job").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
        "time.sleep(60)"), str(tmp_path / "job" / ".run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy, match=rf"running in another process \(pid {holder.pid}\)"), \
                claim(_cfg(tmp_path)):
            pass
    finally:
        holder.kill()
        holder.wait()
    with claim(_cfg(tmp_path)):  # the holder is gone (killed, not cleaned up): the lock went with it
        pass


@pytest.mark.slow
def test_a_rerun_with_other_weights_and_a_second_rerun_at_once_start_nothing(tmp_path):
    """Issue 39 items 10 and 11, through Hydra's launcher: a rerun of a finished sweep with another model.path used
    to skip the job as finished and rewrite its config record; a second rerun of a running sweep trained the same
    job twice into one folder."""
    sweep = tmp_path / "sweep"
    first = subprocess.run(_cmd("-m", "seed=0", f"hydra.sweep.dir={sweep}"), cwd=REPO_ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    job = next(sweep.glob("0_*"))
    record = (job / ".hydra" / "config.yaml").read_text()
    other = subprocess.run(_cmd("-m", "seed=0", f"model.path={tmp_path / 'other'}", f"hydra.sweep.dir={sweep}"),
                           cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    log = other.stdout + other.stderr
    assert "this job folder holds a run with other settings (model.path=None there" in log, log[-3000:]
    assert "finished already" not in log and (job / ".hydra" / "config.yaml").read_text() == record
    assert not (job / "error.txt").exists() and job_state(job) == "finished"
    # a long job in one process; the same command again from a second: refused while the first runs
    long = tmp_path / "long"
    args = ["-m", "seed=0", "trainer.max_steps=1000", f"hydra.sweep.dir={long}"]
    proc = subprocess.Popen(_cmd(*args), cwd=REPO_ROOT, env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not _trained(long, "0_*", 1):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        second = subprocess.run(_cmd(*args), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        log = second.stdout + second.stderr
        assert f"this job is running in another process (pid {proc.pid})" in log, log[-3000:]
        assert "resuming from" not in log and proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
