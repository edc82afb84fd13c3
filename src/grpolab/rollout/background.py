"""One rollout buffer produced in a background thread, with a time limit on waiting for it.

Why a thread and not a process: the sampler's weights, the verifiers and the producer are shared without
pickling, a weight push is a ``load_state_dict`` in memory, and torch releases the GIL inside its kernels, so
generation and the training step run on separate cores (``benchmarks/async_overlap.py`` measures a subprocess
against a thread: it gained 3%, docs/results/sampler_engines.md). With torch's OpenMP backend the intra-op thread count is per Python thread (OpenMP's
per-thread setting): the job sets its own count when it starts, and the trainer's thread may change its own
afterwards without touching the job's (the data module gives the trainer every core after ``rollout.overlap_steps``
steps of each buffer).

The thread is a daemon: a sampler that hangs cannot keep the process alive after the run has stopped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class RolloutEngineError(RuntimeError):
    """The background sampler failed or did not deliver its buffer within ``rollout.generation_timeout_s``."""


class BackgroundJob:
    """Run ``fn()`` in a daemon thread; :meth:`result` waits for it and re-raises its error.

    Args:
        fn: the work (e.g. producing one rollout buffer); must not use torch's global RNG.
        name: for the thread name and error messages (e.g. ``"rollout buffer 3"``).
    """

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.name = name
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.started = time.perf_counter()
        self.finished: float | None = None
        # torch.get_num_threads() reports one process-wide count, but OpenMP's own setting is per OS thread and a
        # new thread starts at the default (all cores). Kernels that ask OpenMP directly (vLLM's CPU attention,
        # which checks that its metadata and its kernel saw the same count) would then disagree with torch:
        # setting the count again inside the job's thread aligns both.
        self._num_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=f"grpolab-{name}", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            torch.set_num_threads(self._num_threads)
            self._value = fn()
        except BaseException as err:  # re-raised in the waiting thread
            self._error = err
        finally:
            self.finished = time.perf_counter()
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None, step: int) -> Any:
        """Wait for the value.

        Args:
            timeout_s: seconds to wait at most (None = forever).
            step: the optimizer step that needs the value (named in errors).

        Raises:
            RolloutEngineError: the job raised (chained) or is still running after ``timeout_s``.
        """
        if not self._done.wait(timeout_s):
            raise RolloutEngineError(f"step {step}: the background sampler did not deliver {self.name} within "
                                     f"rollout.generation_timeout_s={timeout_s} s; the run stops (the last "
                                     f"checkpoint is kept)")
        if self._error is not None:
            raise RolloutEngineError(f"step {step}: the background sampler failed while producing {self.name}: "
                                     f"{type(self._error).__name__}: {self._error}") from self._error
        return self._value

    def wait_quietly(self, timeout_s: float | None = None) -> None:
        """Wait without raising (at teardown, so no thread still samples when the run ends)."""
        self._done.wait(timeout_s)


def half_cores() -> int:
    """Half the CPU cores this process may run on (at least 1): the torch threads of each of trainer and sampler."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


def split_cpu_threads() -> int:
    """Give torch half the CPU cores per Python thread, so trainer and sampler do not oversubscribe them.

    Returns the intra-op thread count now in use. Never raises the count (a run pinned to one thread stays so).
    """
    want = half_cores()
    if torch.get_num_threads() > want:
        log.debug("async generation: torch intra-op threads %d -> %d (trainer and sampler threads get %d each)",
                  torch.get_num_threads(), want, want)
        torch.set_num_threads(want)
    return torch.get_num_threads()
