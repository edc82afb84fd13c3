"""A grid that meets every day's events and keeps every result once: the run owner's acceptance check.

    python scripts/grid_survival.py [--keep <folder>] [--no-slurm]   # 3-5 minutes on 2 CPU cores; exit 0 = all held

Through the real joblib launcher (``hydra/launcher=joblib``, two jobs at once, the tiny fast model, 60 steps, a
validation and ``last.ckpt`` every 20), one sweep folder:

1. ``lr=1e-4,2e-4 seed=0,1`` (4 jobs), **Ctrl-C** to the process group once two jobs train: exit 130, those two
   interrupted with ``last.ckpt``, no queued job started;
2. the same command again (**rerun**), and **a second rerun at once** in another process: every job runs in one of
   them, the other refuses it in one line; a job that started in this round is **killed with SIGKILL** after its
   step-20 checkpoint (its rerun's pool breaks, so that rerun's other job dies too);
3. the same command again: every job ends finished (the killed ones resume from ``last.ckpt``);
4. the grid **extended by a seed** (``seed=0,1,2``, 6 jobs, renumbered): the 4 finished jobs are not trained again,
   the 2 new ones are;
5. when a SLURM cluster answers (``scripts/slurm_local.sh start``; ``--no-slurm`` skips it): the grid extended by
   another seed **through** ``hydra/launcher=slurm`` (8 jobs, every one a SLURM job; the 6 finished ones end at
   once); one new job gets SLURM's **SIGUSR2 (a requeue)** after its step-20 checkpoint, requeues itself and resumes
   in its folder, and the sweep command ends 0.

Then: every job folder (6, or 8 with SLURM) finished with every train step 0..59 in ``metrics.csv`` exactly once
and every validation; the killed job's rows and weights equal an uninterrupted run of its settings, bit for bit (and
the requeued job's, with SLURM); the results export (``sweeps/sweep_status.py --csv``) run twice holds one row per
job. Each defect this covers has its own test in ``tests/`` too (docs/architecture.md, "Who decides what about a run
folder"); this script is the scenario end to end, kept out of the suite for its minutes.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from grpolab.app.run_folder import RunFolder  # noqa: E402

STEPS, VAL = 60, 20  # a validation and last.ckpt every VAL steps; signals land while VAL more steps are left
FAST = ["model.warmstart=null", "model.hidden_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
        "model.num_key_value_heads=1", "model.intermediate_size=64", "data.val_size=8", "data.test_size=16",
        "val.num_generations=2", "algo.num_generations=4", "algo.per_device_train_batch_size=8",
        "trainer.enable_progress_bar=false", "save_policy=true", "val.at_start=false",
        f"trainer.val_check_interval={VAL}", "callbacks.completions.every_n_steps=1000", f"trainer.max_steps={STEPS}"]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def train(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "src" / "train.py"), *[a for a in args if a.startswith("-")], *FAST,
            *[a for a in args if not a.startswith("-")]]


def grid(sweep: Path, seeds: str) -> list[str]:
    return train("-m", "algo.learning_rate=1e-4,2e-4", f"seed={seeds}", "hydra/launcher=joblib",
                 "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}")


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=ENV, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def checkpointed(job: Path) -> int:
    """The step of the job's ``last.ckpt`` (0 without one)."""
    ckpt = RunFolder(job).last_checkpoint
    try:
        return RunFolder.checkpoint_step(ckpt) if ckpt.exists() else 0
    except Exception:  # being written (an atomic rename; a reader may still catch the moment)
        return 0


def wait(what: str, ready, proc: subprocess.Popen | None = None, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not ready():
        if proc is not None and proc.poll() is not None:
            sys.exit(f"FAILED: the sweep ended before {what}:\n{proc.communicate()[0][-3000:]}")
        if time.monotonic() > deadline:
            sys.exit(f"FAILED: no {what} within {limit:.0f} s")
        time.sleep(0.2)


def check(ok: bool, what: str, log: str = "") -> None:
    print(("ok      " if ok else "FAILED  ") + what, flush=True)
    if not ok:
        sys.exit(log[-3000:])


def worker_running(job: Path) -> int | None:
    """The pid of the live process that holds the job's ``.run.lock`` (:mod:`grpolab.app.run_identity`), or None."""
    try:
        fd = os.open(job / ".run.lock", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 64, 0).decode().split()
        return int(pid[0]) if pid else None  # locked, its pid not written yet: read again at the next poll
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def slurm_problem() -> str | None:
    """None when a SLURM node takes jobs (``sinfo``), else why not."""
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no SLURM cluster ({err})"
    if res.returncode != 0 or not any(t.rstrip("*~#") in ("idle", "mix", "alloc") for t in res.stdout.split()):
        return "no SLURM node takes jobs (scripts/slurm_local.sh start)"
    return None


def requeue_one_slurm_job(sweep: Path, jobs) -> Path:
    """Step 5: ``seed=0,1,2,3`` through ``hydra/launcher=slurm``; SIGUSR2 (what submitit asks SLURM to send before
    the time limit) to a new job after its checkpoint; release its requeue's BeginTime hold; the sweep ends 0 with
    8 finished jobs. Returns the requeued job's folder."""
    name = f"grid_survival_{os.getpid()}"
    cmd = train("-m", "algo.learning_rate=1e-4,2e-4", "seed=0,1,2,3", "hydra/launcher=slurm",
                f"hydra.launcher.name={name}", f"hydra.sweep.dir={sweep}")
    before = {j.name for j in jobs()}
    proc = start(cmd)
    target = None

    def a_new_job_past_its_checkpoint() -> bool:
        nonlocal target
        target = next((j for j in jobs() if j.name not in before and "seed-3" in j.name and
                       VAL <= checkpointed(j) < STEPS), None)
        return target is not None

    wait("a SLURM job past its checkpoint", a_new_job_past_its_checkpoint, proc)
    num = target.name.split("_", 1)[0]  # the array index is the job's number (one launch)
    tasks = subprocess.run(["squeue", "-h", "-n", name, "-o", "%A %K"], capture_output=True, text=True,
                           timeout=30).stdout.split("\n")
    job = next(t.split()[0] for t in tasks if t.split()[1:] == [num])
    # scancel is not waited for: here slurmctld delivered the signal and still answered "Job can not be altered now,
    # try again later" (its answer for a pending job), and scancel kept sending it again, up to 80 s, while the job
    # sat requeued; it is stopped once the job has requeued, before its BeginTime hold is released
    sender = subprocess.Popen(["scancel", "--signal=USR2", job], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, restarts = time.monotonic() + 600, set()
    while proc.poll() is None and time.monotonic() < deadline:  # a requeued job pends on SLURM's BeginTime hold
        info = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                              timeout=30).stdout
        restarts |= {kv.split("=", 1)[1] for kv in info.split() if kv.startswith("Restarts=")}
        if restarts - {"0"} and sender.poll() is None:
            sender.kill()
        if "JobState=PENDING" in info and "Reason=BeginTime" in info and sender.poll() is not None:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True, timeout=30)
        time.sleep(0.5)
    if sender.poll() is None:
        sender.kill()
    out = proc.communicate(timeout=60)[0]
    check(restarts - {"0"} != set(), f"SLURM requeued {job} (restart counts seen: {sorted(restarts)})", out)
    log = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.*"))
    states = [RunFolder(j).state() for j in jobs()]
    check(proc.returncode == 0 and states == ["finished"] * 8 and "SIGUSR2: SLURM job" in log,
          f"through SLURM, one job requeued by SIGUSR2 ({job}): exit {proc.returncode}, {len(states)} folders "
          f"{set(states)}", out + log[-3000:])
    check(f"sweep job {target.name} was interrupted at step" in log or "resuming from" in log,
          f"the requeued job {target.name[:40]} resumed in its folder", log[-3000:])
    return target


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one, removed)")
    p.add_argument("--no-slurm", action="store_true", help="skip step 5 (the requeue) even when a cluster answers")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="grid_survival_"))
    sweep = root / "sweep"
    jobs = lambda: sorted(d for d in sweep.iterdir()  # noqa: E731 (.submitit: SLURM's scripts and logs)
                          if d.is_dir() and not d.name.startswith(".")) if sweep.exists() else []

    # 1. Ctrl-C while two jobs train
    first = start(grid(sweep, "0,1"))
    wait("two jobs past their first checkpoint", lambda: sum(
        worker_running(j) is not None and checkpointed(j) >= VAL for j in jobs()) >= 2, first)
    os.killpg(first.pid, signal.SIGINT)
    out = first.communicate(timeout=180)[0]
    states = [RunFolder(j).state() for j in jobs()]
    check(first.returncode == 130 and states.count("interrupted") == 2 and len(states) == 2,
          f"Ctrl-C: exit {first.returncode}, job folders {states} (2 interrupted, no queued job started)", out)

    # 2. two reruns at once; a job that starts in this round killed with SIGKILL after its step-20 checkpoint
    resumed = {j.name for j in jobs()}
    one = start(grid(sweep, "0,1"))
    wait("the first rerun's jobs running", lambda: any(worker_running(j) for j in jobs()))
    two = start(grid(sweep, "0,1"))
    victim = None

    def a_job_past_its_checkpoint() -> bool:
        nonlocal victim
        for j in jobs():
            pid = worker_running(j)
            step = checkpointed(j)
            if pid and j.name not in resumed and VAL <= step < STEPS and RunFolder(j).state() != "finished":
                victim = (j, pid)
                return True
        return False

    wait("a running job past its checkpoint", a_job_past_its_checkpoint)
    os.kill(victim[1], signal.SIGKILL)
    logs = [proc.communicate(timeout=600)[0] for proc in (one, two)]
    refused = sum(log.count("this job is running in another process") for log in logs)
    print(f"        two reruns at once: exits {one.returncode}, {two.returncode}; {refused} job(s) refused as running "
          f"elsewhere; killed {victim[0].name} (pid {victim[1]})")

    # 3. the same command again: everything ends finished
    third = subprocess.run(grid(sweep, "0,1"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    states = [RunFolder(j).state() for j in jobs()]
    check(third.returncode == 0 and states == ["finished"] * 4, f"rerun after the kill: exit {third.returncode}, "
          f"{states}", third.stdout + third.stderr)

    # 4. extended by a seed: 6 jobs, the 4 finished ones not trained again
    before = [(j / "policy" / "model.safetensors").read_bytes() for j in jobs()]
    ext = subprocess.run(grid(sweep, "0,1,2"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    log = ext.stdout + ext.stderr
    states = [RunFolder(j).state() for j in jobs()]
    check(ext.returncode == 0 and states == ["finished"] * 6 and log.count("finished already") == 4,
          f"extended by a seed: exit {ext.returncode}, {len(states)} folders {set(states)}, "
          f"{log.count('finished already')} skipped as finished", log)
    weights = sorted((j / "policy" / "model.safetensors").read_bytes() for j in jobs())
    check(all(w in weights for w in before), "the 4 first jobs' weights are untouched after the extension")

    # 5. through SLURM, extended by another seed; one new job requeued by SIGUSR2 after its checkpoint
    requeued = None
    if args.no_slurm or slurm_problem():
        print(f"        step 5 (a SLURM requeue) skipped: {'--no-slurm' if args.no_slurm else slurm_problem()}")
    else:
        requeued = requeue_one_slurm_job(sweep, jobs)
    n_jobs = 8 if requeued else 6

    # every job: every step once, every validation
    for j in jobs():
        with (j / "metrics.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        train_steps = [int(float(r["step"])) for r in rows if r.get("train/loss")]
        val_steps = sorted({int(float(r["step"])) for r in rows if r.get("val/accuracy")})
        check(train_steps == list(range(STEPS)) and val_steps == list(range(VAL, STEPS + 1, VAL)),
              f"{j.name[:40]}: train steps 0..{STEPS - 1} once each, validations {val_steps}", str(train_steps))

    # the killed job equals an uninterrupted run of its settings
    killed = next(j for j in jobs() if j.name.split("_", 1)[1] == victim[0].name.split("_", 1)[1])
    overrides = [o.strip("- '\"") for o in (killed / ".hydra" / "overrides.yaml").read_text().splitlines()]
    overrides = [o for o in overrides if "=" in o and not o.startswith("hydra")]
    ref = root / "reference"
    done = subprocess.run(train(*overrides, f"hydra.run.dir={ref}"), cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)
    check(done.returncode == 0, f"the uninterrupted reference run of {' '.join(overrides)}", done.stderr)

    def losses(folder: Path) -> list[tuple[str, str]]:
        with (folder / "metrics.csv").open(newline="") as fh:
            return [(r["step"], r["train/loss"]) for r in csv.DictReader(fh) if r.get("train/loss")]

    check(losses(killed) == losses(ref), "the killed job's losses equal the uninterrupted run's, step for step")
    check((killed / "policy" / "model.safetensors").read_bytes() == (ref / "policy" / "model.safetensors").read_bytes(),
          "the killed job's weights equal the uninterrupted run's, bit for bit")
    if requeued:  # the same settings run uninterrupted on this machine (SLURM ran it here too)
        overrides = [o.strip("- '\"") for o in (requeued / ".hydra" / "overrides.yaml").read_text().splitlines()]
        overrides = [o for o in overrides if "=" in o and not o.startswith("hydra")]
        ref = root / "reference_requeued"
        done = subprocess.run(train(*overrides, f"hydra.run.dir={ref}"), cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=300)
        check(done.returncode == 0 and losses(requeued) == losses(ref) and
              (requeued / "policy" / "model.safetensors").read_bytes() ==
              (ref / "policy" / "model.safetensors").read_bytes(),
              "the requeued job's losses and weights equal the uninterrupted run's", done.stderr)

    # the results export, twice: 6 rows, each job once
    rows_csv = root / "rows.csv"
    for _ in range(2):
        res = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(sweep), "--csv", str(rows_csv)], cwd=REPO,
                             env=ENV, capture_output=True, text=True, timeout=120)
        check(res.returncode == 0, "sweeps/sweep_status.py --csv", res.stderr)
    with rows_csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    keys = {(r["arm"], r["seed"]) for r in rows}  # the arm: every override but the seed
    check(len(rows) == n_jobs and len(keys) == n_jobs,
          f"the results export run twice: {len(rows)} rows, {len(keys)} distinct jobs (of {n_jobs})")
    print(f"every check held ({root})")


if __name__ == "__main__":
    main()
