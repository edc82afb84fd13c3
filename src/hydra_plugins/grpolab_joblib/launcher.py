"""Hydra's joblib launcher (``hydra/launcher=joblib``) with a launcher process that lets its jobs save on Ctrl-C.

Ctrl-C (and SLURM's SIGTERM) reaches every process of the group: each job, in its loky worker, stops at its next
step boundary and saves ``last.ckpt`` and an interrupted ``summary.json`` (``grpolab/callbacks/interrupt.py``).
The launcher process, left alone, raises ``KeyboardInterrupt`` in joblib, which then kills the workers, often
before they have saved (the sweep then ends with exit -2 and no checkpoint); and a job that ends with ``sys.exit``
takes its worker down, and joblib the other workers with it, mid-save. :class:`JoblibLauncher` therefore records the first
SIGINT/SIGTERM in the launcher process and waits for the jobs (the sweep ends with their exit status, 130 or 143);
a second signal aborts at once, as in a single run. A signal sent to the launcher process alone (``kill <pid>``)
is not passed on (a job would take it as the second one): send it to the group, ``kill -INT -<pgid>``.

Idle workers (fewer jobs than workers: the tail of every grid) and workers still building their job record the
signal instead of dying of it (a dead worker made loky kill every other one, mid-save), and no queued job starts
after the first signal: :mod:`grpolab.sweep_signals`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher as _HydraJoblibLauncher
from joblib import parallel as joblib_parallel
from joblib._parallel_backends import LokyBackend

from grpolab.sweep_signals import clear_stopped, mark_stopped, record_between_jobs

log = logging.getLogger("grpolab")

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def jobs_save_first(on_first: Callable[[int], None] | None = None) -> Iterator[None]:
    """Within: the first SIGINT/SIGTERM is logged, passed to ``on_first`` and otherwise ignored (the jobs got it too
    and save); a second restores the previous handlers and is raised again (SIGINT: ``KeyboardInterrupt``). Main
    thread only."""
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if on_first is not None:
            on_first(signum)
        log.warning("%s: the running jobs stop at their next step boundary and save last.ckpt; the sweep ends after "
                    "them (send it again to abort now)", name)
        for s in SIGNALS:
            signal.signal(s, abort)

    def abort(signum: int, frame: FrameType | None) -> None:
        for s, h in previous.items():
            signal.signal(s, h)
        signal.raise_signal(signum)

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def start_worker() -> None:
    """loky's ``initializer`` of every worker: signals outside a job are recorded
    (:func:`~grpolab.sweep_signals.record_between_jobs`), and the worker's exit skips the collector's walk over its
    imports (:func:`~grpolab.app.cli.skip_the_exit_collection`, as ``src/train.py``'s)."""
    from grpolab.app.cli import skip_the_exit_collection

    record_between_jobs()
    skip_the_exit_collection()


@contextlib.contextmanager
def workers_record_signals() -> Iterator[None]:
    """Within: joblib's ``"loky"`` backend (what Hydra's launcher asks for by name) starts every worker with
    :func:`start_worker` as loky's ``initializer``."""
    backends = joblib_parallel.BACKENDS
    previous = backends["loky"]
    backends["loky"] = functools.partial(LokyBackend, initializer=start_worker)
    try:
        yield
    finally:
        backends["loky"] = previous


class JoblibLauncher(_HydraJoblibLauncher):
    """``hydra_plugins.hydra_joblib_launcher``'s launcher (the same keys: ``n_jobs``, ``backend``, ...) whose
    launcher process waits for its jobs on the first SIGINT/SIGTERM (:func:`jobs_save_first`)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Run the jobs; when any stopped on a signal (:class:`~grpolab.app.sweep_jobs.JobInterrupted`: a job raises it
        rather than exit, so its worker stays up while the others save), exit with its status once all returned."""
        from grpolab.app.sweep_jobs import JobInterrupted, clear_not_done, exit_if_not_done

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        clear_stopped(sweep_dir)  # this launch runs every job it has
        clear_not_done(sweep_dir)
        with jobs_save_first(functools.partial(mark_stopped, sweep_dir)), workers_record_signals():
            results = super().launch(job_overrides, initial_job_idx)
        codes = [r._return_value.code for r in results if isinstance(r._return_value, JobInterrupted)]
        if codes:
            log.warning("%d of %d jobs stopped on a signal (those that had started saved last.ckpt; the queued ones "
                        "did not start); rerun the same command to resume them", len(codes), len(results))
            sys.exit(max(codes))
        exit_if_not_done(sweep_dir)  # a failed or refused job: exit 1 once every job has returned
        return results
