"""A multirun job folder's identity and owner (grpolab/app/run_identity.py): a folder trained under other settings is
never taken as the same job, and a job running in one process is not started again by a second rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import forkrun
import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg
from omegaconf import open_dict
from test_sweep_resume import ENV, _cmd, _trained

from grpolab.app.run_identity import (
    IDENTITY,
    NotThisJob,
    RunFolderBusy,
    claim,
    differing_keys,
    same_setting,
    settings,
)
from grpolab.app.sweep_resume import job_state

SHORT = ("trainer.max_steps=2", "trainer.val_check_interval=2")  # the folder is under test, not the training


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
    # a record written by another grpolab version (a key it did not have, one it had): the same job
    older = {**recorded, "hash": "0" * 16, "settings": {**recorded["settings"], "algo.removed_key": 1}}
    del older["settings"]["algo.beta"]
    (tmp_path / "job" / IDENTITY).write_text(json.dumps(older))
    with claim(_cfg(tmp_path)):
        pass


def test_a_folder_recorded_before_a_grpolab_class_moved_is_the_same_job(tmp_path):
    with claim(_cfg(tmp_path)):
        pass
    path = tmp_path / "job" / IDENTITY
    recorded = json.loads(path.read_text())
    assert recorded["settings"]["trainer.plugins"] == [{"_target_": "grpolab.checkpoint.io.FileCheckpointIO"}]

    def record(target):
        values = {**recorded["settings"], "trainer.plugins": [{"_target_": target}]}
        path.write_text(json.dumps({"hash": "0" * 16, "settings": values}))

    record("grpolab.old_place.FileCheckpointIO")  # a module path that no longer exists: the class moved
    with claim(_cfg(tmp_path)):
        pass
    for other in ("grpolab.old_place.OtherCheckpointIO", "grpolab.models.FileCheckpointIO", "x.FileCheckpointIO"):
        record(other)  # another class; a module that exists; not grpolab's
        with pytest.raises(NotThisJob, match=r"trainer\.plugins="), claim(_cfg(tmp_path)):
            pass
    assert same_setting("model._target_", "grpolab.gone.TinyCharModel", "grpolab.models.TinyCharModel")
    assert not same_setting("model.name", "grpolab.gone.TinyCharModel", "grpolab.models.TinyCharModel")


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
    first = forkrun.run(_cmd("-m", "seed=0", *SHORT, f"hydra.sweep.dir={sweep}"), cwd=REPO_ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    job = next(sweep.glob("0_*"))
    record = (job / ".hydra" / "config.yaml").read_text()
    args = ["-m", "seed=0", *SHORT, f"model.path={tmp_path / 'other'}", f"hydra.sweep.dir={sweep}"]
    other = forkrun.run(_cmd(*args, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"), cwd=REPO_ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
    log = other.stdout + other.stderr
    assert "this job folder holds a run with other settings (model.path=None there" in log, log[-3000:]
    # the refused job has no result: the sweep says so and exits 1 (it used to exit 0)
    assert other.returncode == 1 and "1 job(s) of the sweep ended without a result" in log, log[-3000:]
    assert f"{job.name}: not started: its folder holds a run with other settings" in log
    assert "finished already" not in log and (job / ".hydra" / "config.yaml").read_text() == record
    assert not (job / "error.txt").exists() and job_state(job) == "finished"
    # a long job in one process; the same command again from a second: refused while the first runs
    long = tmp_path / "long"
    args = ["-m", "seed=0", "trainer.max_steps=1000", f"hydra.sweep.dir={long}"]
    proc = forkrun.Popen(_cmd(*args), cwd=REPO_ROOT, env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not _trained(long, "0_*", 1):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        second = forkrun.run(_cmd(*args), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        log = second.stdout + second.stderr
        assert f"this job is running in another process (pid {proc.pid})" in log, log[-3000:]
        assert second.returncode == 0  # the job's result will come: the other process trains it
        assert "resuming from" not in log and proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)


def test_a_renumbered_job_takes_over_its_old_folder_with_the_same_settings(tmp_path):
    """Issue 39 item 8 (unit): the job's new folder ``2_<overrides>`` takes the files of ``1_<overrides>``, the same
    job under its old number; a folder with other settings, or another job's, is left alone."""
    sweep = tmp_path / "sweep"
    old, other, new = sweep / "1_seed-0+lr-2e-4", sweep / "3_seed-0+lr-2e-4", sweep / "2_seed-0+lr-2e-4"
    cfg = _cfg(tmp_path)
    with open_dict(cfg):
        cfg.paths.output_dir = str(old)
    with claim(cfg):
        (old / "summary.json").write_text("{}")
        (old / "checkpoints").mkdir()
        (old / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
        (old / "train.log").write_text("first launch\n")
    other.mkdir()
    theirs = {**settings(cfg), "seed": 99}  # another job's settings
    (other / IDENTITY).write_text(json.dumps({"hash": "0" * 16, "settings": theirs}))
    (new / ".hydra").mkdir(parents=True)
    (new / "train.log").write_text("this launch\n")
    with open_dict(cfg):
        cfg.paths.output_dir = str(new)
    with claim(cfg):
        pass
    assert not old.exists() and other.exists()
    assert (new / "checkpoints" / "last.ckpt").read_bytes() == b"ckpt" and (new / "summary.json").exists()
    assert (new / "train.log").read_text() == "this launch\n"
    assert (new / "train.before_renumber.log").read_text() == "first launch\n"


def test_two_sweeps_started_in_the_same_second_get_two_folders():
    """Issue 39 item 9: the default sweep folder's time stamp has microseconds, as the single run's has."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.load(REPO_ROOT / "conf" / "hydra" / "default.yaml")
    assert OmegaConf.to_container(hydra)["sweep"]["dir"].endswith("%H-%M-%S-%f}")


@pytest.mark.slow
def test_a_grid_extended_by_a_seed_trains_none_of_its_finished_jobs_again(tmp_path):
    """Issue 39 item 8, through Hydra's launcher: extending ``lr=a,b seed=0`` by ``seed=1`` renumbers (b, 0) from 1
    to 2; it used to train again from scratch into a second folder."""
    sweep = tmp_path / "sweep"
    grid = ["-m", "algo.learning_rate=1e-4,2e-4", *SHORT, f"hydra.sweep.dir={sweep}"]
    first = forkrun.run(_cmd(*grid, "seed=0"), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    (before,) = sweep.glob("1_seed-0+*0.0002*")
    policy = (before / "policy" / "model.safetensors").read_bytes()
    extended = forkrun.run(_cmd(*grid, "seed=0,1"), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                              timeout=600)
    log = extended.stdout + extended.stderr
    assert extended.returncode == 0, log[-3000:]
    assert log.count("finished already") == 2 and "took over 1_seed-0+" in log, log[-3000:]
    jobs = sorted(p.name.split("_", 1)[0] for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2", "3"]  # one folder per job, none left over
    (after,) = sweep.glob("2_seed-0+*0.0002*")
    assert (after / "policy" / "model.safetensors").read_bytes() == policy and job_state(after) == "finished"


def test_a_sequential_sweep_with_a_job_without_result_exits_1_naming_it(tmp_path, caplog):
    """A job that failed or was refused is recorded in the sweep's process; once every job returned, the sweep exits
    1 with one line per such job, and a new launch starts with none."""
    from grpolab.app.sweep_jobs import clear_not_done, exit_if_not_done, not_done, record_not_done

    clear_not_done(tmp_path)
    exit_if_not_done(tmp_path)  # nothing recorded: returns
    record_not_done(tmp_path / "3_seed-1", "failed (error.txt)")
    (tmp_path / ".jobs_not_done").write_text("5_seed-2: not started: other settings\n")  # a worker's record
    assert not_done(tmp_path) == ["3_seed-1: failed (error.txt)", "5_seed-2: not started: other settings"]
    with pytest.raises(SystemExit) as stop:
        exit_if_not_done(tmp_path)
    assert stop.value.code == 1 and "2 job(s) of the sweep ended without a result" in caplog.text
    clear_not_done(tmp_path)
    assert not_done(tmp_path) == [] and not (tmp_path / ".jobs_not_done").exists()
