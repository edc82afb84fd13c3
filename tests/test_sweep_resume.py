"""Multiruns that resume (grpolab/app/sweep_resume.py): the same ``-m`` command rerun into the same sweep folder skips
the finished jobs (their files untouched) and resumes the interrupted ones to the uninterrupted run's result."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkrun
import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT
from safetensors.torch import load_file

from grpolab.app.run_folder import BEFORE_RESUME, RunFolder
from grpolab.app.sweep_resume import job_state

TOTAL = 12
COMMON = [*FAST_OVERRIDES, "val.at_start=false", "trainer.val_check_interval=4", "callbacks.completions.every_n_steps=1000",
          f"trainer.max_steps={TOTAL}"]
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def _cmd(*overrides: str) -> list[str]:
    flags = [o for o in overrides if o.startswith("-")]  # -m before the overrides
    return [sys.executable, str(REPO_ROOT / "src" / "train.py"), *flags, *COMMON,
            *(o for o in overrides if not o.startswith("-"))]


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def test_job_states_of_a_folder(tmp_path):
    assert job_state(tmp_path / "none") == "not started"
    (tmp_path / ".hydra").mkdir()
    assert job_state(tmp_path) == "running or killed"
    (tmp_path / "error.txt").write_text("Traceback")
    assert job_state(tmp_path) == "failed"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert job_state(tmp_path) == "interrupted"
    (tmp_path / "summary.json").write_text(json.dumps({"interrupted": False, "steps": 10}))
    assert job_state(tmp_path) == "finished" and job_state(tmp_path, max_steps=10) == "finished"
    assert job_state(tmp_path, max_steps=20) == "interrupted"  # a longer max_steps: it resumes from last.ckpt
    (tmp_path / "summary.json").write_text("{trunc")  # killed while writing it
    assert job_state(tmp_path) == "interrupted"


def test_metrics_before_a_resume_are_kept_in_front_of_the_resumed_rows(tmp_path):
    old = [{"step": "3", "train/loss": "0.3", "val/accuracy": ""}, {"step": "4", "train/loss": "", "val/accuracy": "0.5"},
           {"step": "4", "train/loss": "0.4", "val/accuracy": ""}, {"step": "5", "train/loss": "0.5", "val/accuracy": ""}]
    _write(tmp_path / "metrics.csv", old)
    RunFolder(tmp_path).set_aside_metrics(step=4)  # killed after step 6 with a periodic checkpoint at step 4
    assert not (tmp_path / "metrics.csv").exists()
    assert [(r["step"], r["train/loss"]) for r in _rows(tmp_path / BEFORE_RESUME)] == [("3", "0.3"), ("4", "")]
    _write(tmp_path / "metrics.csv", [{"step": "4", "train/loss": "0.41", "train/kl": "0"}])  # the resumed run's
    RunFolder(tmp_path).stitch_metrics()
    rows = _rows(tmp_path / "metrics.csv")
    assert [(r["step"], r["train/loss"], r["val/accuracy"], r["train/kl"]) for r in rows] == [
        ("3", "0.3", "", ""), ("4", "", "0.5", ""), ("4", "0.41", "", "0")]
    assert not (tmp_path / BEFORE_RESUME).exists()
    RunFolder(tmp_path).stitch_metrics()  # nothing set aside: unchanged
    assert _rows(tmp_path / "metrics.csv") == rows


def test_two_hard_kills_in_a_row_keep_every_row_before_the_second_checkpoint(tmp_path):
    """Issue 39 item 6: a resumed job killed -9 (no stitch ran) and resumed again: the rows set aside at the first
    resume are put back before the second set-aside, not deleted (steps 0-39 of 150 were lost)."""
    _write(tmp_path / "metrics.csv", [{"step": str(s), "train/loss": f"0.{s}"} for s in range(6)])
    RunFolder(tmp_path).set_aside_metrics(step=3)  # first resume, from a checkpoint at step 3
    _write(tmp_path / "metrics.csv", [{"step": str(s), "train/loss": f"1.{s}"} for s in range(3, 8)])  # then kill -9
    RunFolder(tmp_path).set_aside_metrics(step=6)  # second resume, from a checkpoint at step 6
    _write(tmp_path / "metrics.csv", [{"step": str(s), "train/loss": f"2.{s}"} for s in range(6, 9)])
    RunFolder(tmp_path).stitch_metrics()
    assert [(r["step"], r["train/loss"]) for r in _rows(tmp_path / "metrics.csv")] == [
        ("0", "0.0"), ("1", "0.1"), ("2", "0.2"), ("3", "1.3"), ("4", "1.4"), ("5", "1.5"), ("6", "2.6"),
        ("7", "2.7"), ("8", "2.8")]


def _sigint_when(args: list[str], ready, what: str) -> str:
    """Run ``src/train.py <args>`` in its own process group; SIGINT the group once ``ready()`` (or fail after 240 s
    naming ``what``). Asserts the sweep exits 130; returns its output."""
    proc = forkrun.Popen(_cmd(*args), cwd=REPO_ROOT, env=ENV, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"{what} trained no steps within 240 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-3000:]
    return output


def _trained(sweep: Path, pattern: str, jobs: int) -> bool:
    """``jobs`` job folders matching ``pattern`` each hold a metrics.csv with a few steps."""
    files = list(sweep.glob(f"{pattern}/metrics.csv"))
    return len(files) >= jobs and all(len(p.read_text().splitlines()) > 3 for p in files)


def _interrupt_second_job(sweep: Path) -> None:
    """A 2-job multirun (seed=0,1, one after another); SIGINT to its process group once job 1 has trained a few
    steps (the sweep exits 130)."""
    _sigint_when(["-m", "seed=0,1", f"hydra.sweep.dir={sweep}"], lambda: _trained(sweep, "1_*", 1), "job 1")


def _files(job: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a job folder but Hydra's, the log and the lock (the pid of the process that holds the folder
    now): (mtime_ns, content)."""
    return {str(p.relative_to(job)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(job.rglob("*"))
            if p.is_file() and ".hydra" not in p.parts and p.name not in ("train.log", ".run.lock")}


@pytest.mark.slow
def test_a_rerun_skips_the_finished_job_and_resumes_the_interrupted_one(tmp_path):
    sweep, ref = tmp_path / "sweep", tmp_path / "reference"
    _interrupt_second_job(sweep)
    job0, job1 = (next(sweep.glob(f"{n}_*")) for n in (0, 1))
    assert job_state(job0, TOTAL) == "finished" and job_state(job1, TOTAL) == "interrupted"
    step = json.loads((job1 / "summary.json").read_text())["steps"]
    assert 0 < step < TOTAL
    before = _files(job0)
    status = _status(sweep)
    assert "1 finished, 1 interrupted" in status and f"interrupted step {step} seed=1 (1_" in status, status
    rerun = shlex.split(status.splitlines()[-1])  # the printed rerun of the same command into the same folder
    assert rerun[:3] == ["python", "src/train.py", "-m"] and rerun[-1] == f"hydra.sweep.dir={sweep}"
    # the same command again, two jobs at once (every core): job 0 is skipped, job 1 resumes from its last.ckpt
    res = forkrun.run([sys.executable, *rerun[1:], "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                         cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    assert f"sweep job {job0.name} finished already (step {TOTAL}, summary.json): skipped" in log, log[-3000:]
    assert f"sweep job {job1.name} was interrupted at step {step}: resuming from" in log
    assert _files(job0) == before  # not rerun: not one file rewritten
    assert (job0 / ".hydra" / "config.yaml").exists() and (job0 / ".hydra" / "overrides.yaml").exists()
    # the resumed job ends as the uninterrupted run of the same seed: weights bit for bit, summary, metrics.csv
    done = forkrun.run(_cmd("seed=1", f"hydra.run.dir={ref}"), cwd=REPO_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = load_file(ref / "policy" / "model.safetensors"), load_file(job1 / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s_ref, s_job = (json.loads((d / "summary.json").read_text()) for d in (ref, job1))
    assert s_job["interrupted"] is False and s_job["steps"] == TOTAL
    for key in ("val_accuracy_end", "val_greedy_accuracy_end", "completions", "truncated"):
        assert s_job[key] == s_ref[key], key
    # a resumed run's val_history holds the validations it ran (not kept in last.ckpt); they match the reference's
    assert s_job["val_history"] and s_job["val_history"] == s_ref["val_history"][-len(s_job["val_history"]):]
    rows_ref, rows_job = _rows(ref / "metrics.csv"), _rows(job1 / "metrics.csv")
    train = [[(r["step"], r["train/loss"]) for r in rows if r["train/loss"]] for rows in (rows_ref, rows_job)]
    assert train[0] == train[1] and len(train[1]) == TOTAL  # every step once: the rows before the resume kept
    val = [[(r["step"], r["val/accuracy"]) for r in rows if r["val/accuracy"]] for rows in (rows_ref, rows_job)]
    # a stop at a validation step skips that validation (the resume does not redo it); the others are all there
    assert set(val[1]) <= set(val[0]) and val[1][-1] == val[0][-1] and len(val[1]) >= len(val[0]) - 1
    assert not (job1 / BEFORE_RESUME).exists()
    assert "2 finished" in _status(sweep).splitlines()[-1]
    # a job killed after its last step, before its outputs (summary.json, policy/): the next rerun finishes it from
    # last.ckpt (final validation, summary, policy) instead of refusing a resume at trainer.max_steps
    policy0 = (job0 / "policy" / "model.safetensors").read_bytes()
    (job0 / "summary.json").unlink()
    shutil.rmtree(job0 / "policy")
    again = forkrun.run([sys.executable, *rerun[1:]], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"sweep job {job0.name} trained all {TOTAL} steps but stopped before its summary: finishing from" in (
        again.stdout + again.stderr)
    s0 = json.loads((job0 / "summary.json").read_text())
    assert s0["interrupted"] is False and s0["steps"] == TOTAL
    assert (job0 / "policy" / "model.safetensors").read_bytes() == policy0


def _status(sweep: Path) -> str:
    res = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep)], cwd=REPO_ROOT, env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return "\n".join(" ".join(line.split()) for line in res.stdout.splitlines())  # spaces collapsed


@pytest.mark.slow
def test_ctrl_c_stops_every_job_of_a_joblib_grid_at_a_step_boundary_and_starts_no_queued_one(tmp_path):
    """Two jobs at once in loky workers (one process group with the launcher), a third queued: Ctrl-C reaches both
    running jobs, each saves last.ckpt and an interrupted summary, the queued job does not start (issue 39 item 7:
    it used to run to its end), the sweep exits 130, and the rerun command resumes them."""
    sweep = tmp_path / "sweep"
    out = _sigint_when(["-m", "seed=0,1,2", "trainer.max_steps=1000", "hydra/launcher=joblib",
                        "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"], lambda: _trained(sweep, "[01]_*", 2),
                       "the two jobs")
    for job in sorted(sweep.glob("[01]_*")):
        summary = json.loads((job / "summary.json").read_text())
        assert summary["interrupted"] is True and summary["signal"] == "SIGINT" and summary["steps"] > 0, job
        assert torch.load(job / "checkpoints" / "last.ckpt", map_location="cpu",
                          weights_only=False)["global_step"] == summary["steps"]
        assert job_state(job, 1000) == "interrupted"
    assert not list(sweep.glob("2_*")), out[-3000:]  # the queued job: not started, no folder left behind
    assert "sweep job 2_seed-2" in out and "not started: the sweep was stopped by a signal" in out, out[-3000:]
    assert "2 interrupted" in _status(sweep)


@pytest.mark.slow
def test_ctrl_c_with_an_idle_joblib_worker_still_lets_the_running_job_save(tmp_path):
    """Issue 39 item 1: a grid's tail (a worker idle beside a running job): Ctrl-C used to kill the idle worker in
    loky's queue read, and loky then every worker as a broken pool, the running job mid-step (no last.ckpt, exit 1).
    Now the idle worker records it; the running job saves and the sweep exits 130."""
    sweep, idle_since = tmp_path / "sweep", []

    def short_job_done_and_long_one_training() -> bool:  # the short job's worker idle for a second
        if not idle_since:
            log = next(iter(sweep.glob("0_*/train.log")), None)
            if log is not None and "] done: " in log.read_text():
                idle_since.append(time.monotonic())
            return False
        return time.monotonic() - idle_since[0] > 1 and _trained(sweep, "1_*", 1)

    out = _sigint_when(["-m", "trainer.max_steps=2,1000", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                        f"hydra.sweep.dir={sweep}"], short_job_done_and_long_one_training, "the long job")
    assert "KeyboardInterrupt" not in out, out[-3000:]  # the idle worker died of it, and loky killed the pool
    short, long = (next(sweep.glob(f"{n}_*")) for n in (0, 1))
    assert job_state(short, 2) == "finished"
    summary = json.loads((long / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGINT" and summary["steps"] > 0
    assert torch.load(long / "checkpoints" / "last.ckpt", map_location="cpu",
                      weights_only=False)["global_step"] == summary["steps"]
    assert not list(long.glob("checkpoints/*.tmp*"))


@pytest.mark.slow
def test_ctrl_c_in_a_one_job_at_a_time_joblib_grid_starts_no_next_job(tmp_path):
    """hydra.launcher.n_jobs=1: joblib runs the jobs in the launcher's own process, where the running job's handler
    takes the Ctrl-C; the job marks the sweep stopped itself, so the next job does not start (it did: seen on the
    replication grid, which went on to its next job after the Ctrl-C)."""
    sweep = tmp_path / "sweep"
    out = _sigint_when(["-m", "seed=0,1", "trainer.max_steps=1000", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1",
                        f"hydra.sweep.dir={sweep}"], lambda: _trained(sweep, "0_*", 1), "job 0")
    assert json.loads(next(sweep.glob("0_*/summary.json")).read_text())["interrupted"] is True
    assert not list(sweep.glob("1_*/metrics.csv")), out[-3000:]
