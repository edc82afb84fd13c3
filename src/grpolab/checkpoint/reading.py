"""Reading a checkpoint that ``ckpt_path`` names: safely (a checkpoint is data; its pickle never runs code), and the
checks before a resume (the file exists and is a checkpoint; ``trainer.max_steps`` is not already reached).

Every error names the key (``ckpt_path``) and the path, as a :class:`~grpolab.errors.ConfigError`.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from grpolab.errors import ConfigError, ConfigPathError


def check_checkpoint(path: str | Path, key: str = "ckpt_path") -> Path:
    """Refuse a checkpoint that is missing, empty or not a PyTorch file, naming the path.

    Returns:
        The path.

    Raises:
        ConfigPathError: (a ``FileNotFoundError``) if it does not exist (or is a folder).
        ConfigError: if it is empty (e.g. the run was killed while writing it) or not a PyTorch
            checkpoint (neither a zip archive, as ``torch.save`` writes, nor a legacy pickle).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigPathError(f"{key}={path}: no such checkpoint file")
    size = p.stat().st_size
    if size == 0:
        raise ConfigError(f"{key}={path}: the checkpoint file is empty (0 bytes); it was probably cut off while "
                          "being written. Resume from another checkpoint (e.g. checkpoints/last.ckpt)")
    with p.open("rb") as f:
        head = f.read(2)
    if not zipfile.is_zipfile(p) and head[:1] != b"\x80":
        raise ConfigError(f"{key}={path}: not a PyTorch checkpoint ({size} bytes, neither a zip archive nor a "
                          "pickle); it may be truncated or another kind of file")
    return p


def load_checkpoint(path: str | Path, key: str = "ckpt_path", mmap: bool = True) -> Any:
    """A Lightning checkpoint read with ``torch.load(weights_only=True)``: tensors, numbers, strings and containers
    only, never code (a pickle that calls a function, e.g. ``os.system`` from a ``__reduce__``, is refused before
    anything runs; Lightning's own resume loads the same way). Memory-mapped by default (its header and small
    entries are read, not the weights); a legacy (non-zip) file, which cannot be memory-mapped, is read whole.

    Every checkpoint this project writes loads so (the rollout buffer and the ``grpolab`` entry hold plain
    values), so no safe globals are added.

    Returns:
        What the file holds (a dict for a Lightning checkpoint).

    Raises:
        ConfigError: naming ``key=path`` when the file holds anything but weights and plain values.
    """
    import pickle

    import torch

    p = Path(path).expanduser()
    try:
        try:
            return torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        why = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[0] if lines else "")
        raise ConfigError(f"{key}={path}: refused to load: the file holds objects other than weights and plain "
                          f"values, which could run code ({why}). grpolab's own checkpoints never do; load only "
                          "checkpoints you trust") from err


def check_resume_steps(path: str | Path, max_steps: Any, key: str = "ckpt_path") -> int:
    """Refuse a resume whose ``trainer.max_steps`` the checkpoint has already reached (it would train nothing).

    The checkpoint is memory-mapped, so only its header is read, not the weights.

    Returns:
        The checkpoint's step (``global_step``, the optimizer steps done).

    Raises:
        ValueError: naming ``trainer.max_steps``, the checkpoint's step and the fix (a larger ``trainer.max_steps``).
    """
    ckpt = load_checkpoint(path, key)
    step = int(ckpt.get("global_step", 0)) if isinstance(ckpt, dict) else 0
    if isinstance(max_steps, int) and max_steps >= 0 and step >= max_steps:
        raise ConfigError(f"trainer.max_steps={max_steps} is already reached by {key}={path} (step {step}): nothing "
                         f"to train. To continue the run, resume with trainer.max_steps=<larger than {step}>")
    return step
