"""What the memory plan reads from the ``trainer`` node: processes, strategy, precision, and the memory one process
can see on this machine. Light: torch is imported only to ask a GPU its size."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from grpolab.errors import ConfigError

_PRECISION_ALIASES = {"bf16": "bf16-mixed", "16": "16-mixed", "32": "32-true", "64": "64-true"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def devices_per_node(trainer: Any) -> int:
    """Processes per node from ``trainer.devices`` (``auto``, -1 and unreadable values plan one; the run's own
    device check names a bad value)."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, (list, tuple)) or (OmegaConf.is_list(devices)):
        return len(devices)
    if isinstance(devices, str):
        ids = [d for d in devices.split(",") if d.strip()]
        devices = len(ids) if len(ids) > 1 else (int(devices) if devices.strip().isdigit() else 1)
    return devices if isinstance(devices, int) and devices >= 1 else 1


def strategy_kind(trainer: Any, world: int) -> str:
    """``fsdp``, ``ddp`` (DeepSpeed included, planned as DDP) or ``single`` from ``trainer.strategy`` and the world size."""
    strategy = trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")
    if "ModelParallel" in target or "FSDP" in target or target.startswith("fsdp"):
        return "fsdp"
    if "DDP" in target or "DeepSpeed" in target or target.startswith(("ddp", "deepspeed")) or world > 1:
        return "ddp"
    return "single"


def precision_bytes(precision: Any, model_dtype: str) -> tuple[int, int, bool, int]:
    """``(param_bytes, compute_bytes, autocast, adapter_bytes)`` for ``trainer.precision`` and ``model.dtype``."""
    if model_dtype not in _DTYPE_BYTES:
        raise ConfigError(f"model.dtype must be one of {sorted(_DTYPE_BYTES)}, got {model_dtype!r}")
    p = _PRECISION_ALIASES.get(str(precision), str(precision))
    weights = _DTYPE_BYTES[model_dtype]
    if p.endswith("-mixed"):
        return weights, 2, True, 4
    if p in ("bf16-true", "16-true"):  # Lightning converts the whole module, adapters included
        return 2, 2, False, 2
    if p == "64-true":
        return 8, 8, False, 8
    return weights, weights, False, 4


def on_gpu(trainer: Any) -> bool:
    """True when ``trainer.accelerator`` is ``gpu`` or ``cuda``."""
    return str(trainer.get("accelerator", "cpu")).lower() in ("gpu", "cuda")


def available_memory(trainer: Any, processes: int = 1) -> tuple[int | None, str]:
    """Bytes one process may use, and where the number comes from.

    GPU: the total memory of this process's device (``torch.cuda.mem_get_info`` on ``LOCAL_RANK``); None when
    no GPU is visible (e.g. ``plan_only`` on a machine without one). CPU: ``MemTotal`` of ``/proc/meminfo``
    (``psutil`` elsewhere) divided by the ``processes`` that share this node.
    """
    if on_gpu(trainer):
        import torch

        if not torch.cuda.is_available():
            return None, "no GPU visible on this machine"
        _, total = torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return int(total), "GPU memory of this device"
    total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except OSError:
        try:
            import psutil

            total = int(psutil.virtual_memory().total)
        except ImportError:
            return None, "total RAM unknown"
    if total is None:
        return None, "total RAM unknown"
    return total // max(processes, 1), "RAM" + (f" / {processes} processes" if processes > 1 else "")
