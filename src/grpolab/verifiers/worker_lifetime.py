"""A reward worker process's lifetime: it goes when the training process that started it dies (a parent-death signal
and a watchdog), so a worker stuck in a hung call never outlives a killed trainer."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCHDOG_S = 1.0  # how often a worker checks that its training process still lives (where prctl is missing)


def die_with_parent(parent: int) -> None:
    """Make this worker go when the training process ``parent`` dies, whatever it is doing.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, which the kernel delivers even to a worker stuck in a C call that
    holds the GIL (the parent *thread* counts: workers are started from a thread that lives as long as the training
    process, :func:`grpolab.verifiers.process_pool._spawn`). Everywhere: a daemon thread that exits the worker once ``os.getppid()`` is no longer
    ``parent`` (also covers a parent that died before the prctl). SIGTERM ends the worker once the training process
    is gone; while it lives, SIGTERM and SIGINT are ignored: a terminal's Ctrl-C or SLURM's SIGTERM to every process
    of a job reaches the trainer too, which finishes its step (with these workers' rewards) and closes them.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def orphaned() -> bool:
        return os.getppid() != parent

    def on_term(signum: int, frame: Any) -> None:
        if orphaned():
            os._exit(128 + signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_term)
    if orphaned():
        os._exit(1)

    def watch() -> None:
        while not orphaned():
            time.sleep(WATCHDOG_S)
        os._exit(1)

    threading.Thread(target=watch, name="grpolab-parent-watchdog", daemon=True).start()
