"""Hydra's joblib launcher (``hydra/launcher=joblib``) with a launcher process that lets its jobs save on Ctrl-C.

Ctrl-C (and SLURM's SIGTERM) reaches every process of the group: each job, in its loky worker, stops at its next
step boundary and saves ``last.ckpt`` and an interrupted ``summary.json`` (``grpolab/callbacks/interrupt.py``).
The launcher process, left alone, raises ``KeyboardInterrupt`` in joblib, which then kills the workers, often
before they have saved (the sweep then ends with exit -2 and no checkpoint); and a job that ends with ``sys.exit``
takes its worker down, and joblib the other workers with it, mid-save. :class:`JoblibLauncher` therefore records the first
SIGINT/SIGTERM in the launcher process and waits for the jobs (the sweep ends with their exit status, 130 or 143);
a second signal aborts at once, as in a single run. A signal sent to the launcher process alone (``kill <pid>``)
is not passed on (a job would take it as the second one): send it to the group, ``kill -INT -<pgid>``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher as _HydraJoblibLauncher

log = logging.getLogger("grpolab")

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def jobs_save_first() -> Iterator[None]:
    """Within: the first SIGINT/SIGTERM is logged and otherwise ignored (the jobs got it too and save); a second
    restores the previous handlers and is raised again (SIGINT: ``KeyboardInterrupt``). Main thread only."""
    previous = {s: signal.getsignal(s) for s in SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
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


class JoblibLauncher(_HydraJoblibLauncher):
    """``hydra_plugins.hydra_joblib_launcher``'s launcher (the same keys: ``n_jobs``, ``backend``, ...) whose
    launcher process waits for its jobs on the first SIGINT/SIGTERM (:func:`jobs_save_first`)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        """Run the jobs; when any stopped on a signal (:class:`~grpolab.sweep_jobs.JobInterrupted`: a job raises it
        rather than exit, so its worker stays up while the others save), exit with its status once all returned."""
        from grpolab.sweep_jobs import JobInterrupted

        with jobs_save_first():
            results = super().launch(job_overrides, initial_job_idx)
        codes = [r._return_value.code for r in results if isinstance(r._return_value, JobInterrupted)]
        if codes:
            log.warning("%d of %d jobs stopped on a signal and saved last.ckpt; rerun the same command to resume them",
                        len(codes), len(results))
            sys.exit(max(codes))
        return results
