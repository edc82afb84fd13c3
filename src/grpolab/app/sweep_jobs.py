"""The jobs of a multirun: what a failing job does (:func:`task_wrapper`: its error in the job's folder, the sweep goes
on), and, for jobs at once on one machine (``hydra/launcher=joblib``), a one-line warning when they ask for more
threads than the machine has cores.

``conf/hydra/launcher/joblib.yaml`` runs ``hydra.launcher.n_jobs`` jobs at once (-1: one per core), each in its own
process with ``torch_threads`` torch threads. N jobs x T threads beyond the cores oversubscribes the CPU: every
parallel region waits for a descheduled thread, and the grid runs slower than with fewer jobs (see
docs/results/performance.md for the measured cost). Choose N = cores // T; the embedded tiny models run on one
thread (``torch_threads=auto``), so N = cores.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from grpolab.app.cli import in_multirun, one_line, user_error, wants_traceback

log = logging.getLogger("grpolab")


def joblib_jobs(n_jobs: int, cores: int) -> int:
    """The jobs joblib runs at once for ``n_jobs`` on ``cores`` cores: ``n_jobs`` when positive, else
    ``cores + 1 + n_jobs`` (joblib's rule: -1 = every core, -2 = all but one), at least 1."""
    return n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)


def cores_warning(jobs: int, threads: int, cores: int) -> str | None:
    """A one-line warning when ``jobs`` x ``threads`` exceeds ``cores``, naming the keys to change; else None."""
    if jobs * threads <= cores:
        return None
    return (f"{jobs} jobs at once (hydra.launcher.n_jobs) x {threads} torch threads (torch_threads) > {cores} cores: "
            f"set hydra.launcher.n_jobs={max(1, cores // threads)} or torch_threads={max(1, cores // jobs)}")


def check_cores(cfg: DictConfig) -> str | None:
    """Under Hydra's joblib launcher, log (and return) :func:`cores_warning` for this job; None otherwise.

    Args:
        cfg: the job's composed config (``torch_threads``, ``model._target_``); the launcher settings are read
            from Hydra's config.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    launcher = HydraConfig.get().get("launcher") or {}
    if "joblib" not in str(launcher.get("_target_", "")).lower():
        return None
    from grpolab.callbacks.threads import resolve_torch_threads

    cores = os.cpu_count() or 1
    threads = resolve_torch_threads(cfg.get("torch_threads", "auto"), OmegaConf.select(cfg, "model._target_"))
    warning = cores_warning(joblib_jobs(int(launcher.get("n_jobs") or -1), cores), threads or cores, cores)
    if warning:
        log.warning(warning)
    return warning


def task_wrapper(fn: Callable[[DictConfig], dict | None]) -> Callable[[DictConfig], dict | None]:
    """In a multirun, a failing job writes ``error.txt`` in its folder and the sweep goes on (a config error is
    logged as its one line, anything else with its traceback); a single run re-raises so the exit status is
    non-zero."""

    @functools.wraps(fn)
    def wrapped(cfg: DictConfig) -> dict | None:
        try:
            return fn(cfg)
        except Exception as ex:
            from grpolab.app.run_identity import NotThisJob, RunFolderBusy

            if not in_multirun():
                raise
            out = Path(cfg.paths.output_dir)
            if isinstance(ex, NotThisJob):  # another run's folder: not started, nothing written there
                log.error("job not started: %s", one_line(str(ex)))
                if not isinstance(ex, RunFolderBusy):  # the other process owns that job; this one has no result
                    record_not_done(out, "not started: its folder holds a run with other settings")
                return None
            out.mkdir(parents=True, exist_ok=True)
            (out / "error.txt").write_text(traceback.format_exc())
            if (err := user_error(ex)) is not None and not wants_traceback():  # a config error: its line only
                log.error("job failed: %s; the sweep continues (see %s)", one_line(str(err)), out / "error.txt")
            else:
                log.exception("job failed; the sweep continues (see %s)", out / "error.txt")
            record_not_done(out, "failed (error.txt)")
            return None

    return wrapped


def objective(summary: dict | None) -> float | None:
    """What ``src/train.py`` returns to a sweeper (``hydra/sweeper=optuna`` maximizes it): ``val_accuracy_end`` of a
    finished run whose last validation is at its last step. None for a failed or interrupted run, and for one whose
    end validation was cut short by a signal (its last validation is an earlier step's), so the search records a
    failed trial rather than a score of another step.

    Args:
        summary: the run's ``summary.json`` (a skipped finished job's, read back), or None (a job that raised).
    """
    if not summary or summary.get("failed") or summary.get("interrupted"):
        return None
    history = summary.get("val_history") or []
    if not history or history[-1].get("step") != summary.get("steps"):
        return None
    return summary.get("val_accuracy_end")


class JobInterrupted(Exception):
    """A job of a ``hydra/launcher=joblib`` sweep stopped by a signal, its outputs saved: raised instead of
    ``sys.exit(code)``, because a loky worker that exits takes its sibling jobs down, mid-save. Hydra records it as
    the job's result; the launcher ends the sweep with ``code`` once every job has returned.

    Attributes:
        code: the exit status, 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, code: int) -> None:
        super().__init__(f"the job stopped on a signal (exit status {code}); its last.ckpt and summary.json are saved")
        self.code = int(code)

    def __reduce__(self) -> tuple:  # back from the worker process intact
        return (JobInterrupted, (self.code,))


def in_joblib_sweep() -> bool:
    """True inside a job of a ``hydra/launcher=joblib`` multirun (our launcher's ``_target_``)."""
    if not in_multirun():
        return False
    return "grpolab_joblib" in str(OmegaConf.select(HydraConfig.get(), "launcher._target_") or "")


def stopped_sweep_code() -> int | None:
    """In a job of a ``hydra/launcher=joblib`` sweep whose launcher got a signal before the job started: its exit
    status (128 + the signal number), after one log line (the job trains nothing; a rerun of the same command runs
    it). The folder Hydra made for it goes when it holds nothing else (``.hydra/``, its log), so the sweep's status
    says "not started"; a folder with a run in it is kept. None otherwise (:mod:`grpolab.sweep_signals`)."""
    from grpolab.sweep_signals import stopped_code

    if not in_joblib_sweep():
        return None
    code = stopped_code(HydraConfig.get().sweep.dir)
    if code is not None:
        out = Path(HydraConfig.get().runtime.output_dir)
        if out.is_dir() and all((e.name == ".hydra" and e.is_dir()) or (e.suffix == ".log" and e.is_file())
                                for e in out.iterdir()):  # only what Hydra made for this launch: a job never started
            for handler in list(logging.root.handlers):
                if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == out:
                    handler.close()
                    logging.root.removeHandler(handler)
            shutil.rmtree(out, ignore_errors=True)  # sweep_status reads no folder as "not started"
        log.warning("sweep job %s not started: the sweep was stopped by a signal; rerun the same command to run it",
                    out.name)
    return code


NOT_DONE_FILE = ".jobs_not_done"  # in hydra.sweep.dir: one line per job of this launch that failed or was refused
_not_done: list[str] = []  # this process's (a sequential sweep runs its jobs in the launcher's process)


def record_not_done(job_dir: Path, why: str) -> None:
    """Note a multirun job that ended without a result (failed, or refused as another run's folder): in this
    process and, for jobs run in other processes (joblib's workers, SLURM's jobs), in :data:`NOT_DONE_FILE` of the
    sweep folder. The sweep goes on; it ends with exit status 1 and one line per such job (:func:`exit_if_not_done`).
    Not under ``hydra/sweeper=optuna``: a failed trial is the study's to count (its ``max_failure_rate``)."""
    if HydraConfig.initialized() and "optuna" in str(OmegaConf.select(HydraConfig.get(), "sweeper._target_")):
        return  # a failed trial of a study: the sweeper's max_failure_rate decides
    line = f"{job_dir.name}: {why}"
    _not_done.append(line)
    if HydraConfig.initialized():
        sweep = Path(str(HydraConfig.get().sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        with open(sweep / NOT_DONE_FILE, "a") as f:  # one short line per write: appends do not interleave
            f.write(line + "\n")


def not_done(sweep_dir: str | Path | None = None) -> list[str]:
    """The jobs recorded by :func:`record_not_done` in this process and in ``sweep_dir``'s file, in order, once each."""
    lines = list(_not_done)
    if sweep_dir is not None and (path := Path(sweep_dir) / NOT_DONE_FILE).is_file():
        lines += path.read_text().splitlines()
    return list(dict.fromkeys(lines))


def clear_not_done(sweep_dir: str | Path) -> None:
    """Forget the jobs an earlier launch recorded (a new launch reports its own)."""
    _not_done.clear()
    (Path(sweep_dir) / NOT_DONE_FILE).unlink(missing_ok=True)


def exit_if_not_done(sweep_dir: str | Path | None = None) -> None:
    """After every job of a sweep returned: when any ended without a result, log one line per job and exit 1 (a
    script or CI that runs a grid sees it failed; the rest of the grid's results are kept)."""
    if lines := not_done(sweep_dir):
        log.error("%d job(s) of the sweep ended without a result:\n  %s", len(lines), "\n  ".join(lines))
        raise SystemExit(1)
