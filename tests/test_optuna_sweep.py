"""The Optuna search (``hydra/sweeper=optuna``, src/hydra_plugins/grpolab_optuna, sweeps/optuna_lr.yaml): the README's
command on the tiny fast model; the same command again continues the study in ``<sweep>/optuna.db`` (more trials
added, none rerun or restarted, every trial a job folder of its own), and after a Ctrl-C the interrupted trial is
left running in the study (no value told), then resumed from its last.ckpt by the rerun and told its real value."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import forkrun
import pytest
import yaml
from conftest import FAST_OVERRIDES, REPO_ROOT
from hydra.core.utils import JobStatus
from test_sweeps_notebook import compose_sweep

from grpolab.app.sweep_jobs import objective
from grpolab.app.sweep_resume import job_state

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
README_COMMAND = ["src/train.py", "--config-dir", "sweeps", "--config-name", "optuna_lr"]


def _cmd(sweep: Path, steps: int, trials: int) -> list[str]:
    return [sys.executable, *README_COMMAND, *FAST_OVERRIDES, f"trainer.max_steps={steps}", "val.at_start=false",
            "trainer.val_check_interval=4", "callbacks.completions.every_n_steps=1000",
            f"hydra.sweeper.n_trials={trials}", f"hydra.sweep.dir={sweep}"]


def _study(sweep: Path):
    os.environ.setdefault("SQLALCHEMY_SILENCE_UBER_WARNING", "1")  # optuna 2.10 on SQLAlchemy 1.4
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="optuna_lr", storage=f"sqlite:///{sweep}/optuna.db")


def _summary(job: Path) -> dict:
    return json.loads((job / "summary.json").read_text())


def _check_trial_folder(sweep: Path, trial, steps: int) -> Path:
    """A completed trial: its job folder ``<number>_<overrides>`` in the sweep, with Hydra's record (the trial's
    learning rate in the composed config) and a finished summary.json whose val_accuracy_end is the trial's value."""
    job = Path(trial.user_attrs["grpolab_job_dir"])
    assert job.parent == sweep and job.name.startswith(f"{trial.number}_algo.learning_rate-"), job
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        assert (job / ".hydra" / name).exists(), name
    config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
    assert config["algo"]["learning_rate"] == trial.params["algo.learning_rate"]
    assert job_state(job, steps) == "finished"
    summary = _summary(job)
    assert summary["steps"] == steps and summary["interrupted"] is False
    assert trial.value == summary["val_accuracy_end"] and summary["val_history"][-1]["step"] == steps
    return job


def test_the_example_composes_to_the_resumable_sweeper():
    cfg = compose_sweep("optuna_lr", [])
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.grpolab_optuna.sweeper.OptunaSweeper"
    assert sweeper.direction == "maximize" and sweeper.study_name == "optuna_lr" and sweeper.n_jobs == 1
    assert sweeper.storage == "sqlite:///multirun/optuna_lr/study/optuna.db"  # fixed: a rerun finds the study
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 0
    assert sweeper.params["algo.learning_rate"] == "tag(log, interval(1e-5, 1e-3))"
    assert cfg.hydra.mode.name == "MULTIRUN"


def test_a_run_reports_its_end_accuracy_only_when_it_validated_at_its_last_step():
    history = [{"step": 0, "accuracy": 0.1}, {"step": 8, "accuracy": 0.4}]
    done = {"interrupted": False, "steps": 8, "val_accuracy_end": 0.4, "val_history": history}
    assert objective(done) == 0.4
    assert objective(None) is None  # the job raised (its error.txt)
    assert objective({**done, "interrupted": True}) is None
    assert objective({**done, "failed": True}) is None  # a sampler failure keeps the last validation's number
    # a signal during the end validation: the run is finished, its last validation an earlier step's
    assert objective({**done, "steps": 10, "signal": "SIGINT", "stopped_in": "final validation"}) is None
    assert objective({**done, "val_history": []}) is None


def test_a_job_without_a_number_fails_its_trial():
    from hydra_plugins.grpolab_optuna._impl import _value

    def ret(value, status=JobStatus.COMPLETED):
        return SimpleNamespace(return_value=value) if status == JobStatus.COMPLETED else _Raising(value)

    assert _value(ret(0.25)) == (0.25, "")
    assert _value(ret(None))[0] is None and "no objective" in _value(ret(None))[1]
    assert _value(ret(float("nan")))[0] is None
    assert _value(ret("x"))[0] is None
    assert _value(ret(ValueError("boom"), JobStatus.FAILED)) == (None, "the job raised ValueError: boom")


def test_a_signal_after_a_trials_last_step_stops_the_search(tmp_path):
    from hydra_plugins.grpolab_optuna._impl import _stopped_by_signal

    (tmp_path / "summary.json").write_text(json.dumps({"interrupted": False, "signal": "SIGINT"}))
    assert _stopped_by_signal(tmp_path, since=0) == "SIGINT"
    assert _stopped_by_signal(tmp_path, since=time.time() + 60) is None  # an earlier run's summary (a skipped job)
    (tmp_path / "summary.json").write_text(json.dumps({"interrupted": False, "signal": None}))
    assert _stopped_by_signal(tmp_path, since=0) is None


class _Raising:
    def __init__(self, err: Exception) -> None:
        self.err = err

    @property
    def return_value(self):
        raise self.err


@pytest.mark.slow
def test_a_ctrl_c_mid_trial_is_resumed_by_the_rerun_and_more_trials_continue_the_study(tmp_path):
    """One study through its life: a Ctrl-C mid-trial, the rerun that resumes it, the same command with more
    trials (one new trial, the others kept), and once more (nothing to run)."""
    sweep, steps = tmp_path / "study", 16
    proc = forkrun.Popen(_cmd(sweep, steps, trials=2), cwd=REPO_ROOT, env=ENV, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    try:  # SIGINT to the sweep's process group (Ctrl-C) once trial 1 has trained a few steps
        while not any(len(p.read_text().splitlines()) > 3 for p in sweep.glob("1_*/metrics.csv")):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "trial 1 trained no steps within 240 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-3000:]
    assert "stay running in the study; rerun the same command to resume them" in output
    job1 = next(sweep.glob("1_*"))
    assert job_state(job1, steps) == "interrupted"
    step = _summary(job1)["steps"]
    assert 0 < step < steps
    trials = _study(sweep).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "RUNNING"]  # no value told for the interrupted trial
    assert trials[1].value is None and trials[1].params["algo.learning_rate"] != trials[0].params["algo.learning_rate"]
    # sweep_status.py lists the trials' folders (no grid points: a search has none) and prints the rerun
    status = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep)], cwd=REPO_ROOT, env=ENV,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-3000:]
    lines = [" ".join(line.split()) for line in status.stdout.splitlines()]
    assert "1 finished, 1 interrupted" in lines, status.stdout
    rerun = shlex.split(lines[-1])
    assert rerun[:3] == ["python", "src/train.py", "-m"] and "optuna_lr" in rerun, rerun
    assert rerun[-1] == f"hydra.sweep.dir={sweep}" and "hydra.sweeper.n_trials=2" in rerun
    # that command (the same command): trial 1 runs again in its folder, resumed from its last.ckpt; no new trial
    rerun = forkrun.run([sys.executable, *rerun[1:]], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    log = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, log[-3000:]
    assert "2 trials (1 complete, 0 failed, 1 interrupted: resumed first), 0 new" in log, log[-3000:]
    assert f"sweep job {job1.name} was interrupted at step {step}: resuming from" in log
    after = _study(sweep).trials
    assert [t.state.name for t in after] == ["COMPLETE", "COMPLETE"]
    assert after[0].datetime_complete == trials[0].datetime_complete  # trial 0 not run again
    assert after[1].params == trials[1].params
    assert _check_trial_folder(sweep, after[1], steps) == job1
    _check_trial_folder(sweep, after[0], steps)
    assert len([p for p in sweep.iterdir() if p.is_dir()]) == 2
    # the same command with more trials: one new trial, numbered on (its folder is 2_..., not a second 0_...)
    before = {t.number: t for t in after}
    again = forkrun.run(_cmd(sweep, steps, trials=3), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-3000:]
    assert "2 trials (2 complete, 0 failed, 0 interrupted: resumed first), 1 new to reach n_trials=3" in log, log[-3000:]
    assert "finished already" not in log  # no new trial was handed an old trial's folder (and result)
    trials = _study(sweep).trials
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in trials)
    for n in (0, 1):  # kept as they were: continued, not restarted
        assert trials[n].params == before[n].params and trials[n].datetime_complete == before[n].datetime_complete
    # the continued sampler is seeded with seed + 2: the seeded start-up draws of the first run are not repeated
    lrs = [t.params["algo.learning_rate"] for t in trials]
    assert len(set(lrs)) == 3, lrs
    jobs = {_check_trial_folder(sweep, t, steps) for t in trials}
    assert jobs == {p for p in sweep.iterdir() if p.is_dir()}  # one job folder per trial, nothing else
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    best = max(trials, key=lambda t: t.value)
    assert results["best_value"] == best.value and results["best_params"] == best.params
    # the whole study again: nothing left to run, nothing launched
    done = forkrun.run(_cmd(sweep, steps, trials=3), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "Launching" not in done.stdout + done.stderr
    assert len(_study(sweep).trials) == 3
