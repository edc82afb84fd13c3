"""The training run behind ``src/train.py``: build everything from a composed config, fit, summarise."""

from __future__ import annotations

import functools
import json
import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig, OmegaConf

from grpolab.callbacks.progress import silence_expected_lightning_warnings
from grpolab.config import GRPOConfig
from grpolab.distributed import check_trainer
from grpolab.evaluation.final import check_final_eval, final_eval
from grpolab.lora import count_parameters, save_policy, validate_lora
from grpolab.module import GRPOModule
from grpolab.plan_check import check_memory_plan, plan_summary
from grpolab.rollout.copy_engine import HFSamplerCopyEngine
from grpolab.rollout.datamodule import RolloutDataModule
from grpolab.rollout.engine import HFGenerationEngine
from grpolab.rollout.prompt_lengths import setup_prompt_limit
from grpolab.rollout.settings import RolloutSettings, split_rollout_config
from grpolab.validation import check_checkpoint, check_types, checkpoint_cadence_warning

log = logging.getLogger("grpolab")


def _build(cfg: DictConfig, node: str, **kwargs: Any) -> Any:
    target = OmegaConf.select(cfg, f"{node}._target_")
    log.info("instantiating %s <%s>", node, target)
    return instantiate(cfg[node], **kwargs)


def task_wrapper(fn: Callable[[DictConfig], dict | None]) -> Callable[[DictConfig], dict | None]:
    """In a multirun, a failing job writes ``error.txt`` in its folder and the sweep goes on; a single run
    re-raises so the exit status is non-zero."""

    @functools.wraps(fn)
    def wrapped(cfg: DictConfig) -> dict | None:
        try:
            return fn(cfg)
        except Exception:
            multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
            if not multirun:
                raise
            out = Path(cfg.paths.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "error.txt").write_text(traceback.format_exc())
            log.exception("job failed; the sweep continues (see %s)", out / "error.txt")
            return None

    return wrapped


def rollout_settings(cfg: DictConfig, algo: GRPOConfig) -> tuple[dict[str, Any], RolloutSettings]:
    """Split ``cfg.rollout`` into the engine's constructor arguments and the validated schedule settings
    (conf/rollout/base.yaml); raises ``ValueError`` naming ``rollout.<key>`` before any model is built.
    ``rollout.async_generation=true`` with the in-place HF engine switches to its copy-owning variant."""
    engine_args, settings = split_rollout_config(OmegaConf.to_container(cfg.rollout, resolve=True))
    engine_cls = get_class(engine_args["_target_"])
    if settings.async_generation and engine_cls is HFGenerationEngine:  # async implies a sampler with own weights
        log.info("rollout.async_generation=true: sampling from a copy of the policy (rollout=hf_copy)")
        engine_args["_target_"] = f"{HFSamplerCopyEngine.__module__}.{HFSamplerCopyEngine.__qualname__}"
        engine_cls = HFSamplerCopyEngine
    if algo.vllm_importance_sampling_correction and not getattr(engine_cls, "reports_sampler_logp", False):
        raise ValueError("algo.vllm_importance_sampling_correction=true needs an engine that reports its own "
                         "log-probs (rollout=vllm); this rollout samples with the trainer's own forward")
    if (settings.async_generation and getattr(engine_cls, "reports_sampler_logp", False)
            and (engine_args.get("recompute_sampler_logp") or algo.vllm_importance_sampling_correction)):
        raise ValueError("rollout.async_generation=true with rollout=vllm takes log alpha from the engine: "
                         "rollout.recompute_sampler_logp and algo.vllm_importance_sampling_correction need a trainer "
                         "forward on the sampler's weights, which a background buffer does not have")
    if settings.async_generation and getattr(engine_cls, "reports_sampler_logp", False):
        engine_args["keep_sampler_weights"] = True  # a checkpoint with a buffer in flight stores the sampler's weights
    settings = settings.validate(algo, bool(getattr(engine_cls, "owns_weights", False)), engine_cls)
    check_installed = getattr(engine_cls, "check_installed", None)
    if check_installed is not None:  # e.g. rollout=vllm without vLLM: the install command, before any model
        check_installed()
    return engine_args, settings


def build(cfg: DictConfig) -> dict[str, Any]:
    """Validate the settings, then instantiate task, verifier, model spec, module, data module, trainer."""
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))  # fails before any model
    check_types(cfg)  # every other key with a simple type, named (trainer.max_steps=abc), before any model
    drop = cfg.get("resume_drop_buffer", False)
    if not isinstance(drop, bool):
        raise ValueError(f"resume_drop_buffer must be true or false, got {drop!r}")
    if cfg.get("ckpt_path"):
        check_checkpoint(cfg.ckpt_path)
    engine_args, settings = rollout_settings(cfg, algo)
    lora = validate_lora(cfg.model.get("lora"), algo.ref_refresh_every)
    check_trainer(cfg.trainer, export_lora=lora.enabled and bool(cfg.save_policy),
                  rollout_target=str(cfg.rollout.get("_target_", "")))
    check_final_eval(cfg.get("final_eval"))
    check_memory_plan(cfg, algo, lora)  # logged; refuses a run that cannot fit (plan.check) before any model
    L.seed_everything(cfg.seed, workers=True)
    task = _build(cfg, "data")
    reward_model = _build(cfg, "verifier")
    model_spec = _build(cfg, "model")
    module = GRPOModule(model=model_spec, cfg=algo, optimizer=instantiate(cfg.algo.optimizer),
                        lr_scheduler=instantiate(cfg.algo.lr_scheduler) if cfg.algo.get("lr_scheduler") else None,
                        task=task, val_num_generations=cfg.val.num_generations)
    tokenizer = module.tokenizer
    setup_prompt_limit(algo, model_spec, task, tokenizer)  # every row of every split, before the first step
    log.info("instantiating rollout <%s> (%s)", engine_args["_target_"], settings)
    engine = instantiate(engine_args, stop_token_ids=model_spec.stop_token_ids(tokenizer),
                         pad_token_id=tokenizer.pad_token_id)
    datamodule = RolloutDataModule(task, reward_model, engine, algo, seed=cfg.seed, val_batch_size=cfg.val.batch_size,
                                   rollout=settings, resume_drop_buffer=bool(cfg.get("resume_drop_buffer", False)))
    datamodule.connect(module)
    callbacks = [_build(cfg.callbacks, k) for k in cfg.get("callbacks") or {}]
    if (cadence := checkpoint_cadence_warning(cfg)) is not None:
        log.warning(cadence)
    if OmegaConf.select(cfg, "trainer.enable_progress_bar") is False:  # Lightning refuses a bar callback then
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    silence_expected_lightning_warnings()
    loggers = [_build(cfg.logger, k) for k in cfg.get("logger") or {}]
    trainer = _build(cfg, "trainer", callbacks=callbacks, logger=loggers)
    return {"algo": algo, "task": task, "module": module, "datamodule": datamodule, "trainer": trainer}


def run_training(cfg: DictConfig) -> dict:
    """Fit and write ``summary.json`` and ``policy/`` into the run folder. Returns the summary."""
    start = time.perf_counter()
    out = Path(cfg.paths.output_dir)
    parts = build(cfg)
    trainer, module, dm, algo = parts["trainer"], parts["module"], parts["datamodule"], parts["algo"]
    if cfg.val.at_start and not cfg.ckpt_path:
        trainer.validate(module, datamodule=dm, verbose=False)
    trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
    if not module.val_history or module.val_history[-1]["step"] != module.global_step:
        trainer.validate(module, datamodule=dm, verbose=False)
    final = run_final_eval(cfg, module, dm, parts["task"], out, write=trainer.is_global_zero)
    summary = summarize(cfg, algo, module, dm, time.perf_counter() - start)
    summary.update(world_size=int(trainer.world_size), **count_parameters(module.policy))
    summary.update(final, memory_plan=plan_summary(cfg))
    if trainer.is_global_zero:  # under DDP/FSDP only rank 0 writes the run folder
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if cfg.save_policy:  # every rank takes part (FSDP gathers the shards), rank 0 writes
        save_policy(module.policy, module.tokenizer, out / "policy", write=trainer.is_global_zero)
    if not trainer.is_global_zero:
        return summary
    log.info("summary: %s", json.dumps(summary))
    return summary


def run_final_eval(cfg: DictConfig, module: GRPOModule, dm: RolloutDataModule, task: Any, out: Path,
                   write: bool = True) -> dict:
    """``final_eval.enabled``: score the final policy (mean@n on ``final_eval.split``), write ``final_eval.json``
    (with per-prompt fractions) and return the summary keys (``test_mean_at_16``, ``test_mean_at_16_se``, ...)."""
    fe = cfg.get("final_eval")
    if not fe or not fe.get("enabled"):
        return {}
    t0 = time.perf_counter()
    # module.producer samples the live policy (also when the training sampler owns a stale copy)
    result = final_eval(module.policy, module.producer, task, split=fe.split, num_samples=fe.num_samples,
                        max_prompts=fe.get("max_prompts"), batch_size=fe.batch_size, seed=fe.seed)
    result = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.items()}  # NaN -> null
    result["final_eval_s"] = round(time.perf_counter() - t0, 2)
    if write:  # under DDP every rank scores (the same samples), rank 0 writes
        out.mkdir(parents=True, exist_ok=True)
        (out / "final_eval.json").write_text(json.dumps(result, indent=2))
    log.info("final eval: %s", {k: v for k, v in result.items() if k != "per_prompt"})
    return {k: v for k, v in result.items() if k != "per_prompt"}


def summarize(cfg: DictConfig, algo: GRPOConfig, module: GRPOModule, dm: RolloutDataModule, total_s: float) -> dict:
    hist = module.val_history
    # "start" is the step-0 measurement only (val.at_start); with at_start=false it is null, not a later step
    first = next((h for h in hist if h["step"] == 0), {})
    last = hist[-1] if hist else {}
    return {
        "val_accuracy_start": first.get("accuracy"),
        "val_accuracy_end": last.get("accuracy"),
        "val_greedy_accuracy_start": first.get("greedy_accuracy"),
        "val_greedy_accuracy_end": last.get("greedy_accuracy"),
        "val_best_accuracy": max((h["accuracy"] for h in hist), default=None),
        "val_history": hist,
        "steps": int(module.global_step),
        "sampler_refreshes": int(dm.rounds),
        "weight_syncs": int(dm.weight_syncs),
        "time_weight_sync_s": round(dm.time_weight_sync_s, 4),
        "async_generation": dm.settings.async_generation,
        "time_generation_s": round(dm.time_generation_s, 2),
        "time_total_s": round(total_s, 2),
        "time_rollout_s": round(dm.time_rollout_s, 2),
        "time_train_s": round(module.time_train_s, 2),
        "completions": dm.producer.counters.get("completions", 0),
        "unscorable": dm.producer.counters.get("unscorable", 0),
        "truncated": dm.producer.counters.get("truncated", 0),
        "skipped_unscorable_rows": dict(dm.skipped_rows),
        "algo": algo.name,
        "steps_per_generation": algo.steps_per_generation,
        "num_iterations": algo.num_iterations,
        "clip_mode": algo.clip_mode,
        "ratio_reference": algo.ratio_reference,
        "importance_sampling_level": algo.importance_sampling_level,
        "importance_weight_cap": algo.importance_weight_cap,
        "mask_zero_std_groups": algo.mask_zero_std_groups,
        "loss_type": algo.loss_type,
        "beta": algo.beta,
        "learning_rate": algo.learning_rate,
        "seed": int(cfg.seed),
        "model": str(cfg.model._target_),
        "data": str(cfg.data._target_),
    }
