"""glibc's mmap threshold for a run: freed tensors go back to the OS instead of staying resident in the heap.

glibc serves an allocation above its mmap threshold with its own ``mmap`` (returned to the OS on ``free``) and a
smaller one from the heap (kept resident after ``free`` unless it sits at the heap's top). The threshold starts
at 128 KiB but is *dynamic*: each time a mapped block is freed, glibc raises it to that block's size (up to
32 MiB on 64-bit). After the first training step most weight-gradient, optimizer and activation tensors of a
small model (a few MiB each at Qwen2.5-0.5B widths) therefore come from the heap, and its freed holes stay
resident: measured 130-156 MiB per 0.5B-width decoder layer after a bf16 step against 86 with a fixed
threshold (weights + AdamW states: 85), ``benchmarks/malloc_retention.py``.

``malloc_mmap_threshold`` in ``conf/train.yaml`` (default ``auto``: glibc's dynamic threshold for the embedded tiny
models, faster, and 131072, glibc's own starting value, for every other model, so that the memory plan holds)
fixes it with
``mallopt(M_MMAP_THRESHOLD, ...)``, which also turns the dynamic adjustment off, and exports
``MALLOC_MMAP_THRESHOLD_`` so the run's child processes (DDP ranks, a vLLM engine core or server) start with it.
``null`` keeps glibc's default (measured 8-31% less CPU per step, under load). Elsewhere (macOS, musl, Windows) it does nothing.

Jobs of one Hydra multirun share a process: each job sets its own threshold and ``MALLOC_MMAP_THRESHOLD_`` (a job
with ``null`` puts the variable back as the process started), so no job inherits an earlier job's value. glibc has
no call that turns its dynamic threshold back on, so a ``null`` job after a fixed one keeps the fixed threshold in
the trainer process, with a warning (its child processes do start dynamic).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import Any

from grpolab.errors import ConfigError
from grpolab.plan.memory import SMALL_MODEL_TARGETS  # torch-free, as this module must be

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3          # glibc's <malloc.h>
MAX_THRESHOLD = 32 << 20       # glibc's HEAP_MAX / DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: mallopt refuses more
ENV = "MALLOC_MMAP_THRESHOLD_"
_START_ENV = os.environ.get(ENV)  # the variable as the process started (a user's own value wins for children)
_fixed: list[int] = []  # the thresholds this process's glibc was fixed at (mallopt cannot undo it)


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it exports ``gnu_get_libc_version``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # musl (Alpine) and others: their allocators have no such threshold
    return libc


AUTO_THRESHOLD = 128 << 10    # what ``auto`` fixes for models other than the embedded tiny ones (glibc's start value)


def check_mmap_threshold(setting: object, model_target: str | None = None) -> int | None:
    """``malloc_mmap_threshold`` resolved to None (glibc's dynamic default) or an int in bytes in [0, 32 MiB].

    Args:
        setting: None, bytes, or ``"auto"``: None for the embedded tiny models (their tensors are small and a
            fixed threshold only costs CPU), :data:`AUTO_THRESHOLD` for every other model, whose activations
            glibc's heap would otherwise keep resident beyond the memory plan (measured: a Qwen2.5-1.5B LoRA step
            with gradient checkpointing peaked at 10.5 GiB under the dynamic threshold, 7.2 GiB fixed; plan 7.7).
        model_target: ``model._target_`` of the run (read by ``auto``).

    Raises:
        ConfigError: naming ``malloc_mmap_threshold`` for anything else.
    """
    if setting is None:
        return None
    if setting == "auto":
        return None if model_target in SMALL_MODEL_TARGETS else AUTO_THRESHOLD
    if isinstance(setting, bool) or not isinstance(setting, int) or not 0 <= setting <= MAX_THRESHOLD:
        raise ConfigError(f"malloc_mmap_threshold must be auto, null (glibc's dynamic default) or bytes in "
                          f"0..{MAX_THRESHOLD}, got {setting!r}: e.g. malloc_mmap_threshold=131072")
    return setting


def set_mmap_threshold(setting: object, model_target: str | None = None) -> bool:
    """Fix glibc's mmap threshold at ``setting`` bytes (``auto``: :func:`check_mmap_threshold`) in this process and
    export it to child processes.

    ``None`` sets ``MALLOC_MMAP_THRESHOLD_`` back as the process started (a multirun's earlier job may have
    exported its own); if an earlier job fixed glibc's threshold, it stays fixed here (glibc cannot undo it) and a
    warning says so.

    Returns:
        True when it was set; False for ``None`` or a C library other than glibc (the threshold is not changed).

    Raises:
        ConfigError: for a setting that is neither None nor bytes in [0, 32 MiB].
    """
    threshold = check_mmap_threshold(setting, model_target)
    if threshold is None:
        _export(None)
        if _fixed:
            log.warning("malloc_mmap_threshold=%s asks for glibc's dynamic mmap threshold, but an earlier job of this "
                        "process (a multirun) fixed it at %d bytes and glibc cannot turn the dynamic one back on: "
                        "this job keeps %d. For jobs that do not depend on their order give every job of the sweep "
                        "the same malloc_mmap_threshold", setting, _fixed[-1], _fixed[-1])
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    if libc.mallopt(M_MMAP_THRESHOLD, threshold) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) failed; glibc keeps its dynamic threshold", threshold)
        return False
    _fixed.append(threshold)
    _export(threshold)  # DDP ranks, vLLM engine cores and servers start with it
    return True


def _export(threshold: int | None) -> None:
    """``MALLOC_MMAP_THRESHOLD_`` for child processes: the value the process started with if it had one, else
    ``threshold`` (None: unset)."""
    value = _START_ENV if _START_ENV is not None else (None if threshold is None else str(threshold))
    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value


def apply_config(cfg: Any) -> bool:
    """:func:`set_mmap_threshold` from a composed run config (``malloc_mmap_threshold`` and ``model._target_``);
    what ``src/train.py`` and ``src/eval.py`` call before torch allocates."""
    model = cfg.get("model") or {}
    return set_mmap_threshold(cfg.get("malloc_mmap_threshold"), model.get("_target_"))
