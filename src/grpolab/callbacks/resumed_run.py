"""Which run a resume continues, for the loggers that keep one record across resumes (W&B, TensorBoard).

A checkpoint lives in its run folder's ``checkpoints/`` (``conf/callbacks/default.yaml``), so the run a
``ckpt_path`` continues is the folder above that one: another folder for a resume by hand (``ckpt_path=...`` writes
a new run folder), the same folder for a multirun job rerun into its sweep or a requeued SLURM job.
"""

from __future__ import annotations

from pathlib import Path

from grpolab.checkpoint.reading import load_checkpoint
from grpolab.run_files import write_text


def checkpoint_run_dir(ckpt_path: str | Path | None) -> Path | None:
    """The run folder of a checkpoint (``<run>/checkpoints/x.ckpt`` -> ``<run>``), or None without one."""
    if not ckpt_path:
        return None
    return Path(ckpt_path).expanduser().resolve().parent.parent


def checkpoint_step(ckpt_path: str | Path) -> int:
    """``global_step`` of a Lightning checkpoint (memory-mapped, read safely: the weights are not loaded)."""
    return int(load_checkpoint(str(ckpt_path)).get("global_step", 0))


def is_rank_zero() -> bool:
    """True in the process that writes the run folder: rank 0 by Lightning's reading of the environment
    (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``), so also before the trainer exists."""
    from lightning.pytorch.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and a rename (:func:`grpolab.run_files.write_text`):
    a reader sees the old file or the new one."""
    write_text(path, text)
