"""The memory plan's verdict: does the run fit the memory it will have, and which single setting would make it fit.

:mod:`grpolab.app.plan_from_config` maps a config onto a plan; this module reads ``plan.device_memory`` (the device size to plan
against when the machine planning is not the one that will run, e.g. ``+plan_only=true`` on a laptop for an 80 GiB
GPU) and tries settings one at a time by re-planning a copy of the config (``replan``), so the verdict names the knobs
that are enough on their own, with the peak each gives. Nothing here builds or loads a model.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from grpolab.errors import ConfigError
from grpolab.plan.memory import GIB

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
FSDP_DEVICES = (2, 4, 8, 16, 32, 64)  # processes tried by the "more devices with FSDP" knob
_KNOB = re.compile(r"^([A-Za-z_][\w.]*)=(\S+)")

#: ``replan(cfg) -> (peak bytes per process, bytes one process may use)`` (None: no plan, or an unknown budget).
Replan = Callable[[DictConfig], tuple[int | None, int | None]]


def parse_size(value: Any, key: str = "plan.device_memory") -> int | None:
    """Bytes from a size: an int (bytes) or a string with a unit, ``80GiB``, ``81920MiB``, ``80 GB`` (KiB/MiB/GiB/TiB
    are powers of 1024, KB/MB/GB/TB of 1000, case-insensitive); None for null.

    Raises:
        ConfigError: naming ``key`` for anything else (a bool, a negative or zero size, an unknown unit).
    """
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value)) if not isinstance(value, bool) else None
    if match is None or match.group(2).lower() not in UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"{key} must be a device size such as 80GiB, 81920MiB, 80GB or a number of bytes (the "
                          f"memory of one device, per process), got {value!r}")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def _with(cfg: DictConfig, changes: dict[str, Any], replace: bool = False) -> DictConfig | None:
    """A copy of ``cfg`` with ``changes`` (dotted key -> value); None when a key is missing or names a config group,
    unless ``replace`` (then the value is set whatever was there)."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        for key, value in changes.items():
            current = OmegaConf.select(out, key, default="<missing>", throw_on_missing=False)
            if not replace and (isinstance(current, str) and current == "<missing>" or OmegaConf.is_config(current)):
                return None
            OmegaConf.update(out, key, value, merge=False)
    return out


def _try(replan: Replan, cfg: DictConfig | None) -> int | None:
    """The planned peak of ``cfg`` when it fits its budget, else None (also when the setting is refused)."""
    if cfg is None:
        return None
    try:
        peak, budget = replan(cfg)
    except Exception:  # noqa: BLE001 - a combination the checks refuse (or cannot read) is no way to fit: not offered
        return None
    return peak if peak is not None and budget is not None and peak <= budget else None


def fitting_settings(cfg: DictConfig, knobs: list[str], replan: Replan) -> list[str]:
    """The settings that, each alone, make the plan fit, with the peak each gives.

    Tried: every knob of the form ``key=value`` whose key the config has as a plain value (``model.lora.r=16``,
    ``model.gradient_checkpointing=true``, ``rollout.generation_batch_size=16``, ...); the largest
    ``algo.micro_batch_size`` below the current micro-batch that fits; the fewest processes with FSDP
    (``trainer=fsdp trainer.devices=N``, N in :data:`FSDP_DEVICES`) that fit.

    Returns:
        ``"<setting> (<peak> GiB)"`` strings, in the order tried.
    """
    found = []
    for setting in dict.fromkeys(m[0] for knob in knobs if (m := _KNOB.match(knob))):
        key, value = setting.split("=", 1)
        if peak := _try(replan, _with(cfg, {key: yaml.safe_load(value)})):
            found.append(f"{setting} ({peak / GIB:.1f} GiB)")
    rows = OmegaConf.select(cfg, "algo.micro_batch_size") or OmegaConf.select(cfg, "algo.per_device_train_batch_size")
    size = int(rows or 1) // 2
    while size >= 1:
        if peak := _try(replan, _with(cfg, {"algo.micro_batch_size": size})):
            found.append(f"algo.micro_batch_size={size} ({peak / GIB:.1f} GiB)")
            break
        size //= 2
    devices = OmegaConf.select(cfg, "trainer.devices")
    keep = [f"trainer.{k}={v}" for k, v, default in (("accelerator", OmegaConf.select(cfg, "trainer.accelerator"), "cpu"),
                                                      ("precision", OmegaConf.select(cfg, "trainer.precision"), "32-true"))
            if v is not None and str(v) != default]  # conf/trainer/fsdp.yaml is the CPU one: say what to keep
    for n in (d for d in FSDP_DEVICES if not isinstance(devices, int) or d >= devices):
        if peak := _try(replan, _with(cfg, {"trainer.strategy": "fsdp", "trainer.devices": n}, replace=True)):
            found.append(" ".join(["trainer=fsdp", *keep, f"trainer.devices={n}"]) + f" ({peak / GIB:.1f} GiB)")
            break
    return found


def verdict(peak: int, budget: int | None, source: str, fits_with: list[str], largest: str) -> list[str]:
    """The lines under the plan's table: ``fits`` or ``does not fit`` against ``budget`` (from ``source``), the
    settings that would each make it fit, the largest terms with their knobs; or how to name a device size."""
    if budget is None:
        return [f"verdict: none: the memory this run will have is unknown ({source}); plan against a device with "
                "plan.device_memory=80GiB (its size per process)"]
    if peak <= budget:
        return [f"verdict: fits: {peak / GIB:.1f} GiB per process of {budget / GIB:.1f} GiB ({source}), "
                f"{(budget - peak) / GIB:.1f} GiB to spare"]
    lines = [f"verdict: does not fit: {peak / GIB:.1f} GiB per process, {budget / GIB:.1f} GiB available ({source}): "
             f"{(peak - budget) / GIB:.1f} GiB over"]
    lines.append("  fits with, each alone: " + ("; ".join(fits_with) if fits_with else
                                                 "no single setting tried; combine those below"))
    lines.append(f"  largest terms: {largest}")
    return lines
