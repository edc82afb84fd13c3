"""A test hook that kills the vLLM server a run started (``kill -9``), once, after training step ``step``: the pid
is the engine's own server process. Loaded by src/train.py as ``+callbacks.kill_server._target_=kill_server.
KillServerAt`` with this folder on PYTHONPATH, or appended to a trainer's callbacks."""

from __future__ import annotations

import os
import signal
import sys
import time

import lightning as L


class KillServerAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step, self.killed_pid, self.killed_at = int(step), None, None

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step and self.killed_pid is None:
            self.killed_pid, self.killed_at = trainer.datamodule.engine.process.proc.pid, time.monotonic()
            os.kill(self.killed_pid, signal.SIGKILL)
            print(f"kill_server: SIGKILL server pid {self.killed_pid} after step {self.step}", file=sys.stderr,
                  flush=True)
