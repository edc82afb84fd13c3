"""Torch CPU threads for a run: the ``torch_threads`` default, and a warning when the machine is oversubscribed.

On a small CPU shared with other processes, torch's default (one intra-op thread per core) oversubscribes the
cores: every parallel region waits for a descheduled thread, and the tiny model runs many times slower than
with one thread (on a busy 2-core machine 0.70 against 9.05 steps/s: docs/results/performance.md, "Torch threads
on a shared CPU"). The embedded models are too small for
intra-op parallelism to pay, so ``torch_threads: auto`` gives them one thread; other models keep torch's
default.

Thread count and results: the tiny model's logits, losses and gradients were bitwise equal with 1 and 2
threads in tests/callbacks/test_threads.py, but torch does not promise it for every kernel and
shape (a parallel reduction may sum in another order), so treat ``torch_threads`` as part of the configuration
when comparing runs bitwise. A given configuration is deterministic whatever the load.
"""

from __future__ import annotations

import logging
import os

import lightning as L
import torch

from grpolab.errors import ConfigError
from grpolab.plan.memory import SMALL_MODEL_TARGETS  # one thread under torch_threads=auto

log = logging.getLogger(__name__)

#: torch's intra-op thread count when grpolab first touched it (this module's import, before any run changed it):
#: a job whose ``torch_threads`` leaves torch's default gets this, also after an earlier job of the same process
#: (a Hydra multirun) set another count, so jobs of one grid do not depend on their order
ORIGINAL_THREADS = torch.get_num_threads()


def resolve_torch_threads(setting: object, model_target: str | None) -> int | None:
    """The thread count ``torch_threads`` asks for.

    Args:
        setting: ``"auto"`` (one thread for the embedded small models, torch's default otherwise), a positive
            int, or None (torch's default).
        model_target: ``model._target_`` of the run.

    Returns:
        The number of threads to set, or None to leave torch's default.

    Raises:
        ValueError: naming ``torch_threads`` for anything else (0, a negative number, another string).
    """
    if setting is None:
        return None
    if setting == "auto":
        return 1 if model_target in SMALL_MODEL_TARGETS else None
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(f"torch_threads must be auto, null or an integer >= 1, got {setting!r}")
    return setting


def oversubscription_warning(load: float, cores: int, threads: int) -> str | None:
    """A one-line warning when the 1-minute load average exceeds the core count, else None.

    Args:
        load: ``os.getloadavg()[0]``.
        cores: ``os.cpu_count()``.
        threads: the torch threads this run uses.
    """
    if load <= cores:
        return None
    hint = ("it already uses one thread; fewer parallel runs would help more" if threads == 1 else
            "set torch_threads=1 (one torch thread per run), often several times faster on a busy machine")
    return (f"the machine is oversubscribed: load average {load:.1f} on {cores} cores, this run uses {threads} "
            f"torch thread{'s' if threads != 1 else ''}; {hint}")


def apply_torch_threads(setting: object, model_target: str | None) -> int:
    """Set torch's intra-op threads from ``torch_threads`` and warn (one line) when the machine is oversubscribed.

    Call it before any model is built (every job of a multirun does). A setting that leaves torch's default sets
    :data:`ORIGINAL_THREADS` back, so a job never inherits the count of an earlier job in the same process.
    Returns the thread count in effect.

    Raises:
        ValueError: see :func:`resolve_torch_threads`.
    """
    resolved = resolve_torch_threads(setting, model_target)
    threads = ORIGINAL_THREADS if resolved is None else resolved
    if torch.get_num_threads() != threads:
        log.info("torch CPU threads: %d -> %d (torch_threads=%s)", torch.get_num_threads(), threads, setting)
        torch.set_num_threads(threads)
    in_effect = torch.get_num_threads()
    if hasattr(os, "getloadavg"):
        warning = oversubscription_warning(os.getloadavg()[0], os.cpu_count() or 1, in_effect)
        if warning:
            log.warning(warning)
    return in_effect


class TorchThreads(L.Callback):
    """Call ``torch.set_num_threads(num_threads)`` when the run starts (``setup``, before training).

    The top-level ``torch_threads`` key does this before the model is built and covers most needs; the
    callback stays for sweep configs that set it per job.

    Args:
        num_threads: threads for intra-op parallelism (>= 1); None leaves torch's default.

    Raises:
        ValueError: if ``num_threads`` < 1.
    """

    def __init__(self, num_threads: int | None = 1) -> None:
        super().__init__()
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"callbacks.threads.num_threads must be >= 1 or null, got {num_threads}")
        self.num_threads = num_threads

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.num_threads is not None and torch.get_num_threads() != self.num_threads:
            log.info("torch CPU threads: %d -> %d", torch.get_num_threads(), self.num_threads)
            torch.set_num_threads(self.num_threads)
