"""The resumable Optuna search behind ``hydra/sweeper=optuna`` (:mod:`.sweeper` says what differs from the plugin's).

One ``sweep`` call (one command):

1. opens the study in ``storage`` (created on the first run, loaded on a rerun: the plugin's ``load_if_exists``);
2. runs again every trial an earlier command left ``RUNNING`` (a Ctrl-C, SIGTERM or a kill stopped it before its
   value was told), with the overrides it had (kept in the trial's user attribute ``grpolab_overrides``) and
   ``hydra.job.num`` = its number, so it lands in its own job folder and ``grpolab/app/sweep_resume.py`` resumes it from
   ``last.ckpt`` (or returns the summary of a job that had finished); a trial still running in a live process of
   this machine (``grpolab_process``: host and pid) is left alone;
3. asks ``n_trials`` minus the trials already in the study new ones, ``n_jobs`` at a time, each job numbered by
   its trial (``<trial number>_<overrides>``: a rerun, whose ``hydra.job.num`` would restart at 0, never reuses an
   earlier trial's folder, and the finished-job skip of ``sweep_resume`` never hands a new trial an old result);
4. tells each job's value: a float from ``src/train.py`` (``val_accuracy_end`` at the final step) completes the
   trial; None, NaN or an error fails it (``grpolab_failure`` says why). ``grpolab_job_dir`` is the job folder.

A signal that stops a job makes the command exit with the job's status (130 for Ctrl-C) and leaves its trials
``RUNNING`` for the next run; a signal that lands after a job's last training step (its end validation or final
eval; the job itself finishes) stops the sweep after that trial is told. One command per study at a time: a second
command on another machine would take the first one's running trials for interrupted ones.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("SQLALCHEMY_SILENCE_UBER_WARNING", "1")  # optuna 2.10 on SQLAlchemy 1.4: not a user's concern
logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines when optuna imports it

import optuna  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl, create_params_from_overrides  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from optuna.trial import Trial, TrialState  # noqa: E402

log = logging.getLogger(__name__)

OVERRIDES = "grpolab_overrides"  # user attributes of a trial: the overrides its job ran with,
PROCESS = "grpolab_process"      # the sweep process that runs it (host:pid),
JOB_DIR = "grpolab_job_dir"      # its job folder,
FAILURE = "grpolab_failure"      # why it failed


class ResumableOptunaSweeperImpl(OptunaSweeperImpl):
    """hydra-optuna-sweeper's ``OptunaSweeperImpl`` (the same constructor and keys) with a :meth:`sweep` that
    continues the study of ``storage`` (see the module's docstring)."""

    def sweep(self, arguments: list[str]) -> None:
        assert self.config is not None and self.launcher is not None
        self._process_searchspace_config()
        params_conf = self._parse_sweeper_params_config()
        params_conf.extend(arguments)
        is_grid = isinstance(self.sampler, functools.partial) and self.sampler.func == optuna.samplers.GridSampler
        distributions, fixed = create_params_from_overrides(params_conf)
        if self.search_space_distributions:
            distributions = {**self.search_space_distributions, **distributions}
        if is_grid:
            grid = {name: self._to_grid_sampler_choices(d) for name, d in distributions.items()}
            self.sampler = self.sampler(grid)
            self.n_trials = min(self.n_trials, math.prod(len(v) for v in grid.values()))
        for name in fixed:
            distributions.pop(name, None)
        directions = self._get_directions()

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")  # as Hydra's basic sweeper: the sweep's command
        _make_sqlite_folder(self.storage)
        study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=self.sampler,
                                    directions=directions, load_if_exists=True)
        held = study.get_trials(deepcopy=False)
        if held and not is_grid:
            study.sampler = self._reseeded_sampler(len(held))
        running = [t for t in held if t.state == TrialState.RUNNING]
        resume = [t for t in running if not _alive_elsewhere(t)]
        for t in running:
            if t not in resume:
                log.warning("trial %d is running in process %s: left to it", t.number, t.user_attrs.get(PROCESS))
        new = max(0, self.n_trials - len(held))
        states = [t.state for t in held]
        log.info("Study %s in %s: %d trials (%d complete, %d failed, %d interrupted: resumed first), %d new to reach "
                 "n_trials=%d; sampler %s, directions %s", study.study_name, self.storage, len(held),
                 states.count(TrialState.COMPLETE), states.count(TrialState.FAIL), len(resume), new, self.n_trials,
                 type(study.sampler).__name__, directions)

        for i in range(0, len(resume), max(1, self.n_jobs)):
            batch = resume[i:i + max(1, self.n_jobs)]
            overrides = [tuple(t.user_attrs.get(OVERRIDES) or _overrides(t.params, fixed)) for t in batch]
            trials = [Trial(study, t._trial_id) for t in batch]
            for trial in trials:
                trial.set_user_attr(PROCESS, _process())
            self._run(study, trials, overrides)
        while new > 0:
            trials = [study.ask() for _ in range(min(new, max(1, self.n_jobs)))]
            overrides = self._configure_trials(trials, distributions, fixed)
            for trial, job in zip(trials, overrides):
                trial.set_user_attr(OVERRIDES, list(job))
                trial.set_user_attr(PROCESS, _process())
            self._run(study, trials, overrides)
            new -= len(trials)
        self._save_results(study, directions, sweep_dir)

    def _reseeded_sampler(self, held: int) -> Any:
        """The configured sampler again, seeded with ``seed + held`` (a seeded sampler restarted on a continued
        study would otherwise draw the first run's values again); unseeded or not rebuildable: as it is."""
        node = OmegaConf.select(self.config, "hydra.sweeper.sampler")
        seed = None if node is None else node.get("seed")
        if seed is None:
            return self.sampler
        sampler = instantiate(node, seed=int(seed) + held)
        log.info("Sampler seeded with %d + %d trials in the study", seed, held)
        return sampler

    def _run(self, study: optuna.Study, trials: list[Trial], overrides: Sequence[Sequence[str]]) -> None:
        """Launch one job per trial (``hydra.job.num`` = the trial's number) and tell the study each value."""
        start = time.time()
        returns = []
        try:
            for group in _consecutive(list(zip(trials, overrides))):
                returns += self.launcher.launch([o for _, o in group], initial_job_idx=group[0][0].number)
        except BaseException:
            log.warning("trial(s) %s stopped before their values were told: they stay running in the study; rerun the "
                        "same command to resume them", ", ".join(str(t.number) for t in trials))
            raise
        failures, stop = 0, None
        for trial, ret in zip(trials, returns):
            out = _job_dir(ret)
            if out is not None:
                trial.set_user_attr(JOB_DIR, str(out))
            value, why = _value(ret)
            if value is None:
                failures += 1
                trial.set_user_attr(FAILURE, why)
                study.tell(trial, state=TrialState.FAIL)
                log.warning("trial %d (%s) failed: %s", trial.number, out, why)
            else:
                study.tell(trial, value)
                log.info("trial %d (%s): %s", trial.number, out, value)
            stop = stop or (out is not None and _stopped_by_signal(out, start))
        if failures / len(trials) > self.max_failure_rate:
            log.error("%d of %d trials failed (max_failure_rate=%s): the sweep stops; their folders hold error.txt or "
                      "summary.json; a rerun goes on with new trials", failures, len(trials), self.max_failure_rate)
            sys.exit(1)
        if stop:
            log.warning("%s after the last training step of a trial: the sweep stops; rerun the same command to "
                        "continue the study", stop)
            sys.exit(128 + signal.Signals[stop])

    def _save_results(self, study: optuna.Study, directions: list[str], sweep_dir: Path) -> None:
        """``<sweep>/optimization_results.yaml`` as the plugin writes it (when a trial completed)."""
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            log.warning("no trial of study %s has completed", study.study_name)
            return
        if len(directions) < 2:
            best = study.best_trial
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value,
                       "best_trial": best.number, "best_job_dir": best.user_attrs.get(JOB_DIR)}
            log.info("Best trial %d: %s -> %s (%s)", best.number, best.params, best.value,
                     best.user_attrs.get(JOB_DIR))
        else:
            results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                       for t in study.best_trials]}
        OmegaConf.save(OmegaConf.create(results), sweep_dir / "optimization_results.yaml")


def _value(ret: Any) -> tuple[float | None, str]:
    """The job's objective as a float, or None and why it has none."""
    try:
        value = ret.return_value  # re-raises the job's exception
    except Exception as err:  # noqa: BLE001 - any error of the job fails its trial
        return None, f"the job raised {type(err).__name__}: {str(err)[:300]}"
    if value is None:
        return None, ("the job returned no objective (a failed run, or no validation at its final step; see its "
                      "error.txt or summary.json)")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None, f"the job returned {value!r}, not a number"
    if math.isnan(value):
        return None, "the job returned NaN"
    return value, ""


def _job_dir(ret: Any) -> Path | None:
    out = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret.hydra_cfg is not None else None
    return None if out is None else Path(str(out))


def _stopped_by_signal(out: Path, since: float) -> str | None:
    """The signal's name when the job's ``summary.json``, written by this launch, records a stop after its last
    training step (the job finished: its end validation or final eval was cut short)."""
    path = out / "summary.json"
    try:
        if path.stat().st_mtime < since:  # a finished job's earlier summary, skipped by sweep_resume
            return None
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary.get("signal") if isinstance(summary, dict) and summary.get("signal") in signal.Signals.__members__ else None


def _overrides(params: dict, fixed: dict) -> tuple[str, ...]:
    """A trial's job overrides as the plugin builds them: the sampled parameters, then the fixed ones."""
    return tuple(f"{name}={value}" for name, value in {**params, **fixed}.items())


def _consecutive(items: list[tuple[Trial, Sequence[str]]]) -> list[list[tuple[Trial, Sequence[str]]]]:
    """Runs of trials with consecutive numbers: one launch each (the launcher numbers its jobs from the first)."""
    groups: list[list[tuple[Trial, Sequence[str]]]] = []
    for item in items:
        if groups and item[0].number == groups[-1][-1][0].number + 1:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive_elsewhere(trial: optuna.trial.FrozenTrial) -> bool:
    """True when the trial's process (``grpolab_process``) is another live process of this machine."""
    host, _, pid = str(trial.user_attrs.get(PROCESS, "")).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_sqlite_folder(storage: Any) -> None:
    """Create the folder of a ``sqlite:///<path>`` storage (SQLite does not)."""
    if isinstance(storage, str) and storage.startswith("sqlite:///"):
        path = storage[len("sqlite:///"):]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
