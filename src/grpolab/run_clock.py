"""The wall-clock seconds of a run, going on across resumes.

A run may be several processes: interrupted, requeued, rerun into its sweep folder, each resuming from the last
checkpoint. Its time columns (``train/time/elapsed`` in ``metrics.csv``, ``time_total_s`` in ``summary.json``) count
the whole run: the checkpoint keeps the seconds so far (:meth:`RunClock.state_dict`, in ``checkpoint["grpolab"]``)
and the resumed process adds its own to them, so accuracy-against-time curves never go back in time. The seconds
between the checkpoint and a kill are lost with the steps they trained (the resumed run trains those again).

- ``elapsed``: from the start of ``fit`` (the first training step's clock), as ``train/time/elapsed``;
- ``total``: from the start of the run (building the model, validation, final eval), as ``time_total_s``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


class RunClock:
    """Seconds of this process since its starts, plus what the checkpoint it resumed from had counted."""

    def __init__(self) -> None:
        self.elapsed_before = 0.0  # train/time/elapsed of the earlier processes (from the checkpoint)
        self.total_before = 0.0  # time_total_s of the earlier processes
        self._run_start: float | None = None
        self._fit_start: float | None = None

    def start_run(self, now: float | None = None) -> None:
        """The run's start in this process (``time.perf_counter()``, before anything is built)."""
        self._run_start = time.perf_counter() if now is None else now

    def start_fit(self, now: float | None = None) -> None:
        """The start of ``fit`` in this process (``on_fit_start``)."""
        self._fit_start = time.perf_counter() if now is None else now

    def elapsed(self, now: float | None = None) -> float:
        """Training seconds of the whole run so far: the checkpoint's and this process's since :meth:`start_fit`."""
        if self._fit_start is None:
            return self.elapsed_before
        return self.elapsed_before + ((time.perf_counter() if now is None else now) - self._fit_start)

    def total(self, now: float | None = None) -> float:
        """Seconds of the whole run so far: the checkpoint's and this process's since :meth:`start_run` (without a
        :meth:`start_run`, since :meth:`start_fit`)."""
        if self._run_start is None:
            return self.total_before + (self.elapsed(now) - self.elapsed_before)
        return self.total_before + ((time.perf_counter() if now is None else now) - self._run_start)

    def state_dict(self, now: float | None = None) -> dict[str, float]:
        """What a checkpoint keeps: ``{"time_elapsed_s", "time_total_s"}`` at ``now``."""
        return {"time_elapsed_s": self.elapsed(now), "time_total_s": self.total(now)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's seconds (a checkpoint from before the clock has none: 0)."""
        self.elapsed_before = float(state.get("time_elapsed_s", 0.0))
        self.total_before = float(state.get("time_total_s", 0.0))
