"""Save ``last.ckpt`` at the last completed step when the sampler fails (see :mod:`grpolab.rollout.sampler_failure`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L

from grpolab.rollout.sampler_failure import SamplerFailure

log = logging.getLogger(__name__)


class SaveOnSamplerFailure(L.Callback):
    """On a :class:`SamplerFailure`, save ``<ckpt_dir>/last.ckpt`` (the last completed step), in one process.

    Under DDP/FSDP the save is a collective that the other ranks may not reach; there the failure is reported
    without a save, and the last periodic checkpoint is the resume point.

    Args:
        ckpt_dir: where ``last.ckpt`` goes (the folder of the signal path's save).
    """

    def __init__(self, ckpt_dir: str | Path) -> None:
        super().__init__()
        self.ckpt_dir = Path(ckpt_dir)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SamplerFailure) or trainer.world_size > 1:
            return
        path = self.ckpt_dir / "last.ckpt"
        trainer.save_checkpoint(path)
        exception.ckpt_path = path
        log.warning("sampler failure: saved %s at step %d", path, trainer.global_step)


def summary_keys(failure: SamplerFailure | None, restarts: int = 0) -> dict[str, Any]:
    """The ``summary.json`` keys of a run's sampler failure (``failed``, ``failure``) and its sampler restarts
    (``sampler_restarts``: samplers restarted after a failure, the buffer sampled again; the run goes on)."""
    if failure is None:
        return {"failed": False, "failure": None, "sampler_restarts": restarts}
    return {"failed": True, "sampler_restarts": restarts,
            "failure": {"step": failure.step, "reason": failure.reason, "traceback": failure.details,
                        "ckpt_path": str(failure.ckpt_path) if failure.ckpt_path else None}}
