"""Pin the number of torch CPU threads for a run (a callback, so a sweep config can set it)."""

from __future__ import annotations

import logging

import lightning as L
import torch

log = logging.getLogger(__name__)


class TorchThreads(L.Callback):
    """Call ``torch.set_num_threads(num_threads)`` when the run starts (``setup``, before the model is built).

    On a small CPU shared with other processes, torch's default (one thread per core) oversubscribes the cores:
    every parallel region waits for a descheduled thread, and the tiny model runs 5-10x slower than with one
    thread (measured on 2 shared cores: 20 steps in 30 s with 1 thread, 178 s with 2).

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
