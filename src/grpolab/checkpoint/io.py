"""Checkpoints written straight to disk: no second in-memory copy of the weights and optimizer state.

Lightning 2.6's ``TorchCheckpointIO`` (``lightning.fabric.utilities.cloud_io._atomic_save``) serialises every
checkpoint into an ``io.BytesIO`` first and then writes the buffer, so a save holds the whole checkpoint twice:
the live tensors and their serialised bytes. For full fine-tuning with AdamW in float32 that is 12 bytes per
parameter on top of the run (a 0.5B model: +5.5 GiB at every ``last.ckpt``), and it was the peak of the
real-shape runs (docs/results/real_shapes.md). Lightning fixed it upstream after 2.6.6
(Lightning-AI/pytorch-lightning#21823, PR #21824: stream local saves); until a release has it,
:class:`FileCheckpointIO` does the same for local paths and defers to Lightning for any other filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol


class FileCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` whose local saves stream ``torch.save`` into a temporary file.

    The file is written as ``<path>.tmp-<pid>`` in the checkpoint's own folder, flushed to disk, then renamed
    over ``path`` (``os.replace``: atomic on POSIX, as Lightning's transaction is), so a save interrupted by
    a signal or a crash leaves the previous checkpoint intact and no partial ``path``. Peak memory of a save:
    the checkpoint's tensors once (torch writes each storage from its own buffer) instead of twice.
    Loading is Lightning's, unchanged. Remote paths (``s3://``, ``gs://``, ...) use Lightning's save.

    Raises:
        TypeError: ``storage_options`` given (as Lightning's ``TorchCheckpointIO``).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` (anything ``torch.save`` takes) to ``path``, atomically."""
        if not _is_local_file_protocol(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"Trainer.save_checkpoint(..., storage_options=...) is not supported by "
                            f"{type(self).__name__}")
        target = Path(str(path).removeprefix("file://"))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
