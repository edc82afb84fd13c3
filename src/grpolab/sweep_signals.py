"""Signals in a ``hydra/launcher=joblib`` sweep, outside the jobs' training loops: what an idle or starting worker
does with Ctrl-C, and how a queued job learns that the sweep was stopped.

Ctrl-C (SIGTERM, SIGHUP) reaches the whole process group: the launcher, the loky workers running a job (whose
:class:`~grpolab.callbacks.interrupt.StopOnSignal` saves at the next step boundary), and the workers that are idle
or still building their job. Left alone, an idle worker dies of ``KeyboardInterrupt`` in loky's queue read and loky
then kills every worker as a broken pool, the running jobs mid-step or mid-save; and joblib
goes on to start the queued jobs, which run to their end. So:

- every loky worker starts with :func:`record_between_jobs` (loky's ``initializer``): outside a job's
  ``StopOnSignal`` a signal is recorded, never raised; a job whose run begins after it (a worker that was still
  loading its model) stops at its first boundary (:func:`pending_signal`, read by ``StopOnSignal``);
- the launcher process, on the first signal, writes :data:`STOP_FILE` in the sweep folder (:func:`mark_stopped`); a
  job that starts after it returns at once as interrupted (:func:`stopped_sweep_code`) and the rerun of the same
  command runs it; the launcher removes the file when a sweep starts (:func:`clear_stopped`).

No Lightning or torch import: loky's workers import this module before their first job.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_FILE = ".sweep_stopped"  # in hydra.sweep.dir: the signal's name, while the stopped sweep has not been rerun

_pending: list[int] = []  # the first signal this worker got outside a job's StopOnSignal


def record_between_jobs() -> None:
    """Loky worker initializer: SIGINT/SIGTERM/SIGHUP are recorded (:func:`pending_signal`), not raised, whenever no
    job's ``StopOnSignal`` has its own handlers installed (before, between and after the jobs)."""
    for s in SIGNALS:
        signal.signal(s, _record)


def _record(signum: int, frame: FrameType | None) -> None:
    if not _pending:
        _pending.append(signum)


def pending_signal() -> int | None:
    """The signal this process recorded outside a job (see :func:`record_between_jobs`), or None."""
    return _pending[0] if _pending else None


def mark_stopped(sweep_dir: str | Path, signum: int) -> None:
    """Write :data:`STOP_FILE` (the signal's name) in ``sweep_dir``, creating the folder if need be."""
    path = Path(sweep_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / STOP_FILE).write_text(signal.Signals(signum).name + "\n")


def clear_stopped(sweep_dir: str | Path) -> None:
    """Remove :data:`STOP_FILE` from ``sweep_dir`` (a new launch of the sweep runs every job it has)."""
    (Path(sweep_dir) / STOP_FILE).unlink(missing_ok=True)


def stopped_code(sweep_dir: str | Path) -> int | None:
    """128 + the signal number written by :func:`mark_stopped` in ``sweep_dir`` (130 for SIGINT), or None."""
    try:
        name = (Path(sweep_dir) / STOP_FILE).read_text().strip()
    except OSError:
        return None
    return 128 + int(signal.Signals[name]) if name in signal.Signals.__members__ else 128 + int(signal.SIGINT)
