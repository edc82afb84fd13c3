"""Every check of a training config, run before any model is built and before Lightning is imported.

``src/train.py`` calls :func:`preflight` first, so a config error costs the import of torch and transformers
(a few seconds) instead of the whole training stack's; :func:`grpolab.app.run.build` takes its result and never
checks again.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.app.plan_from_config import check_memory_plan
from grpolab.checkpoint.reading import check_checkpoint, check_resume_steps, load_checkpoint
from grpolab.config import GRPOConfig
from grpolab.config_checks import check_paths, check_precision, check_required, check_types
from grpolab.distributed import check_trainer
from grpolab.errors import ConfigError
from grpolab.evaluation.final import check_final_eval
from grpolab.lora import LoraAdapterConfig, validate_lora
from grpolab.rollout.engines.base import GenerationEngine
from grpolab.rollout.resume import resume_conflicts
from grpolab.rollout.settings import RolloutConfig, resolve_rollout

DATAMODULE_STATE_KEY = "RolloutDataModule"  # where Lightning keeps the data module's state_dict in a checkpoint

log = logging.getLogger("grpolab")


@dataclass(frozen=True)
class Checked:
    """What :func:`preflight` found valid: the algorithm settings, the engine class and its constructor node,
    the rollout schedule settings, the LoRA settings and ``resume_drop_buffer``."""

    algo: GRPOConfig
    engine_cls: type[GenerationEngine]
    engine_args: dict[str, Any]
    settings: RolloutConfig
    lora: LoraAdapterConfig
    resume_drop_buffer: bool
    memory_plan: dict | None = None  # the plan made and logged here, for summary.json (made once per run)


def preflight(cfg: DictConfig) -> Checked:
    """Check a composed training config without building anything: required keys, ``imports``, ``algo.*``, every
    simple-typed key, the resume checkpoint, the rollout engine and schedule, LoRA, the trainer, the final eval,
    the memory plan (logged; a run that cannot fit is refused unless ``plan.check=false``) and every path.

    Raises:
        ConfigError: naming the key and the fix (``src/train.py`` prints it as one line, exit status 2).
    """
    check_required(cfg)  # a ??? left in the config (data=jsonl without data.path), named
    import_plugins(cfg.get("imports") or [])  # they may register loss variants that algo.* names
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    check_types(cfg)  # every other key with a simple type, named (trainer.max_steps=abc)
    drop = cfg.get("resume_drop_buffer", False)
    if not isinstance(drop, bool):
        raise ConfigError(f"resume_drop_buffer must be true or false, got {drop!r}: set resume_drop_buffer=true "
                          "or resume_drop_buffer=false")
    if cfg.get("ckpt_path"):
        check_checkpoint(cfg.ckpt_path)
        if not cfg.get("finish_from_checkpoint"):  # set by a multirun rerun for a job stopped after its last step
            check_resume_steps(cfg.ckpt_path, OmegaConf.select(cfg, "trainer.max_steps"))
    engine_cls, engine_args, settings = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    lora = validate_lora(cfg.model.get("lora"), algo.ref_refresh_every)
    from grpolab.warmstart import check_patience

    check_patience(OmegaConf.to_container(cfg.model.warmstart) if cfg.model.get("warmstart") else None)
    check_trainer(cfg.trainer, export_lora=lora.enabled and bool(cfg.save_policy), engine=engine_cls)
    check_precision(cfg.trainer)  # 16-mixed: a GradScaler our manual clipping cannot see
    check_final_eval(cfg.get("final_eval"))
    if cfg.get("ckpt_path"):
        check_saved_rollout(cfg.ckpt_path, algo, cfg.trainer, drop)
    memory_plan = check_memory_plan(cfg, algo, lora)
    check_paths(cfg)  # data.path, data.test_path, model.path, ... that do not exist, named
    return Checked(algo, engine_cls, engine_args, settings, lora, drop, memory_plan)


def planned_world_size(trainer: Any) -> int | None:
    """``trainer.devices x trainer.num_nodes`` when both are integers (the processes the run will have); None when
    Lightning decides (``devices: auto``, a list of devices)."""
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if isinstance(devices, bool) or not isinstance(devices, int) or not isinstance(nodes, int) or devices < 1:
        return None
    return devices * nodes


def check_saved_rollout(path: str, algo: GRPOConfig, trainer: Any, drop_buffer: bool) -> None:
    """Refuse, before any model is built, a resume whose saved rollout buffer the run cannot continue: a changed
    buffer-shaping setting, or another process count while the saved buffers have steps left (the same rule the data
    module applies when it loads the state; :func:`~grpolab.rollout.resume.resume_conflicts`). The checkpoint is
    memory-mapped; nothing is checked when the process count is left to Lightning.

    Raises:
        ConfigError: listing the conflicts and naming ``resume_drop_buffer``.
    """
    world = planned_world_size(trainer)
    if world is None:
        return
    ckpt = load_checkpoint(path)
    state = ckpt.get(DATAMODULE_STATE_KEY) if isinstance(ckpt, dict) else None  # Lightning: keyed by class name
    if isinstance(state, dict):
        resume_conflicts(state, algo, world, drop_buffer)


def import_plugins(modules: list[str]) -> None:
    """Import the modules named by ``imports`` (from the working directory or the Python path).

    Raises:
        ConfigError: naming ``imports`` and the module that could not be imported.
    """
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the working directory, as `python -m` would
    for name in modules:
        try:
            importlib.import_module(str(name))
        except ImportError as err:
            raise ConfigError(f"imports: cannot import {name!r} ({err}); give a module on the Python path or in the "
                              f"working directory") from err
