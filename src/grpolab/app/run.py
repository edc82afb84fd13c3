"""The training run behind ``src/train.py``: build everything from a composed config, fit, summarise."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from grpolab.app.cli import resume_command
from grpolab.app.preflight import Checked, preflight
from grpolab.app.run_folder import RunFolder
from grpolab.app.slurm import requeue, requeue_signals, will_requeue
from grpolab.callbacks.hparams import log_config
from grpolab.callbacks.interrupt import SIGNALS, StopOnSignal, TrainingInterrupted
from grpolab.callbacks.progress import silence_expected_lightning_warnings
from grpolab.callbacks.sampler_failure import SaveOnSamplerFailure, summary_keys
from grpolab.callbacks.threads import apply_torch_threads
from grpolab.config import GRPOConfig
from grpolab.config_checks import checkpoint_cadence_warning
from grpolab.distributed import sum_over_ranks
from grpolab.evaluation.final import FinalEvalStopped, final_eval
from grpolab.lora import count_parameters
from grpolab.lora import save_policy as save_policy_files
from grpolab.module import GRPOModule
from grpolab.rollout.datamodule import RolloutDataModule
from grpolab.rollout.prompt_lengths import with_prompt_limit
from grpolab.rollout.sampler_failure import SamplerFailure
from grpolab.run_files import write_json

log = logging.getLogger("grpolab")

# summary.json counts each rank adds to (skipped_unscorable_rows is not one: every rank filters the whole dataset)
RANK_COUNTERS = ("completions", "unscorable", "truncated")


def _build(cfg: DictConfig, node: str, **kwargs: Any) -> Any:
    target = OmegaConf.select(cfg, f"{node}._target_")
    log.info("instantiating %s <%s>", node, target)
    return instantiate(cfg[node], **kwargs)


def build(cfg: DictConfig, checked: Checked | None = None) -> dict[str, Any]:
    """Validate every setting, then instantiate task, verifier, model spec, module, engine, data module, trainer.

    Settings are validated once, by :func:`~grpolab.app.preflight.preflight` (``checked``: its result when the caller
    already ran it, as ``src/train.py`` does before importing Lightning), before any model is built, and never
    changed afterwards; the parts get built objects or narrow values (the tokenizer, a policy handle), never the
    config.

    Raises:
        ConfigError: naming the key and the fix, for a user error found before anything is built (a wrong value
            or type, a missing key, file or folder, settings that conflict); ``src/train.py`` prints it as one line.
    """
    checked = checked or preflight(cfg)
    silence_expected_lightning_warnings()  # before Lightning's first log line
    algo, engine_args, settings = checked.algo, checked.engine_args, checked.settings
    apply_torch_threads(cfg.get("torch_threads", "auto"), OmegaConf.select(cfg, "model._target_"))
    L.seed_everything(cfg.seed, workers=True)
    task = _build(cfg, "data")
    verifier = _build(cfg, "verifier")
    model_spec = _build(cfg, "model")
    tokenizer = model_spec.load_tokenizer()
    model_spec.check_text(task, tokenizer)  # the tiny model's vocabulary covers every row of every split
    algo = with_prompt_limit(algo, model_spec, task, tokenizer)  # every row of every split, before the first step
    module = GRPOModule(model=model_spec, cfg=algo, optimizer=instantiate(cfg.algo.optimizer),
                        lr_scheduler=instantiate(cfg.algo.lr_scheduler) if cfg.algo.get("lr_scheduler") else None,
                        task=task, tokenizer=tokenizer)
    log.info("instantiating rollout <%s> (%s)", engine_args["_target_"], settings)
    engine = instantiate(engine_args, stop_token_ids=model_spec.stop_token_ids(tokenizer),
                         pad_token_id=tokenizer.pad_token_id)
    datamodule = RolloutDataModule(task, verifier, engine, algo, settings, seed=cfg.seed,
                                   val_batch_size=cfg.val.batch_size, val_num_generations=cfg.val.num_generations,
                                   val_max_prompts=cfg.val.get("max_prompts"),
                                   resume_drop_buffer=checked.resume_drop_buffer)
    datamodule.connect(tokenizer, module.models)
    callbacks = [_build(cfg.callbacks, k) for k in cfg.get("callbacks") or {}]
    if (cadence := checkpoint_cadence_warning(cfg)) is not None:
        log.warning(cadence)
    if OmegaConf.select(cfg, "trainer.enable_progress_bar") is False:  # Lightning refuses a bar callback then
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    # Ctrl-C / SIGTERM: last.ckpt at the next step boundary, next to the ModelCheckpoint that owns last.ckpt
    ckpt_dir = next((c.dirpath for c in callbacks if isinstance(c, ModelCheckpoint) and c.save_last and c.dirpath),
                    Path(cfg.paths.output_dir) / "checkpoints")
    stop = StopOnSignal(ckpt_dir, signals=SIGNALS + requeue_signals())  # SLURM's USR1/USR2: stop and requeue
    callbacks.append(stop)
    callbacks.append(SaveOnSamplerFailure(ckpt_dir))  # a sampler failure: last.ckpt at the last completed step
    silence_expected_lightning_warnings()
    loggers = [_build(cfg.logger, k) for k in cfg.get("logger") or {}]
    log_config(loggers, cfg)  # the composed config as the run's hyperparameters (W&B config, TensorBoard hparams)
    trainer = _build(cfg, "trainer", callbacks=callbacks, logger=loggers)
    return {"algo": algo, "task": task, "module": module, "datamodule": datamodule, "trainer": trainer, "stop": stop,
            "memory_plan": checked.memory_plan}


def run_training(cfg: DictConfig, checked: Checked | None = None) -> dict:
    """Fit and write ``summary.json`` and ``policy/`` into the run folder. Returns the summary.

    SIGINT/SIGTERM (see :mod:`grpolab.callbacks.interrupt`) at any phase writes the summary and ``policy/``:
    during training, training stops at the next step boundary with ``checkpoints/last.ckpt``; during the start
    validation, nothing is trained (no checkpoint); in every case what follows is skipped. The summary's
    ``"interrupted"`` is true when training stopped before its end (``src/train.py`` then exits with 128 + the
    signal number); a stop after the last training step (the final validation or eval) leaves training complete:
    ``"interrupted": false``, with ``"signal"`` and ``"stopped_in"`` saying what was cut short (the run is not
    finished until those numbers are in: :meth:`grpolab.app.run_folder.RunFolder.status`; ``src/train.py`` exits with the
    signal's status here too, so a sweep stops).
    """
    start = time.perf_counter()
    out = Path(cfg.paths.output_dir)
    parts = build(cfg, checked)
    trainer, module, dm = parts["trainer"], parts["module"], parts["datamodule"]
    module.clock.start_run(start)  # time_total_s: this process's seconds plus a resumed checkpoint's
    stop: StopOnSignal = parts["stop"]
    stop.attach(trainer)
    final: dict = {}
    trained = False  # fit returned without a stop: every training step is done
    with stop:  # from here until the outputs are written: a signal stops the phase, a second aborts
        try:
            if cfg.val.at_start and not cfg.ckpt_path:
                _phase(stop, trainer, "start validation", trainer.validate, module, datamodule=dm, verbose=False)
            try:
                trained = _phase(stop, trainer, "training", trainer.fit, module, datamodule=dm,
                                 ckpt_path=cfg.ckpt_path, weights_only=True)  # never code
            except SamplerFailure as err:  # saved by SaveOnSamplerFailure; the outputs are written now
                parts["failure"] = err
                log.error("%s", err)
                return write_outputs(cfg, parts, final, module.clock.total())
            last_val = module.val_history[-1]["step"] if module.val_history else None
            if trained and last_val != module.global_step:
                _phase(stop, trainer, "final validation", trainer.validate, module, datamodule=dm, verbose=False)
            if trained:
                _phase(stop, trainer, "final eval", lambda: final.update(run_final_eval(
                    cfg, module, dm, parts["task"], out, write=trainer.is_global_zero,
                    should_stop=lambda: bool(stop.agreed_signum(trainer)))))
        finally:
            dm.engine.close()
        if stop.signum and trained:
            log.warning("%s (%s), after the last training step: training is complete (last.ckpt, summary.json "
                        "\"interrupted\": false) but what the stop cut short has no number yet: a multirun's rerun "
                        "finishes it from last.ckpt; score a single run with src/eval.py",
                        signal.Signals(stop.signum).name, stop.stopped_in)
        # a SLURM requeue: summary.json only, within the signal's grace period (the resumed run writes policy/)
        requeueing = bool(stop.signum) and not trained and will_requeue(stop.signum)
        summary = write_outputs(cfg, parts, final, module.clock.total(),
                                interrupted=bool(stop.signum) and not trained, save_policy=not requeueing)
    if summary["interrupted"] and trainer.is_global_zero:
        log.warning("to continue this run: %s", resume_command(stop.ckpt_path))
    # SLURM's USR1/USR2 (rank 0): outputs saved, the job goes back to the queue; a run that finished stays done
    requeue(stop.signum if summary["interrupted"] else None)
    return summary


def _phase(stop: StopOnSignal, trainer: L.Trainer, name: str, fn: Any, *args: Any, **kwargs: Any) -> bool:
    """Run ``fn(*args, **kwargs)`` as phase ``name`` unless a stop was requested on any rank (a collective: every
    rank calls it at the same point). Returns True when ``fn`` ran and returned (for ``fit``: every step done)."""
    if signum := stop.agreed_signum(trainer):
        stop.request_stop(signum)  # a rank that did not get the signal skips the phase with the others
        return False
    stop.phase = name
    try:
        fn(*args, **kwargs)
    except (TrainingInterrupted, FinalEvalStopped) as err:
        log.warning("%s stopped: %s", name, err)
        return False
    finally:
        stop.phase = f"after {name}"
    return True


def write_outputs(cfg: DictConfig, parts: dict[str, Any], final: dict, total_s: float,
                  interrupted: bool | None = None, save_policy: bool = True) -> dict:
    """Write ``summary.json`` (rank 0, atomically: :meth:`grpolab.app.run_folder.RunFolder.write_summary`) and ``policy/``
    (``save_policy`` and ``cfg.save_policy``; every rank takes part). Returns the summary. ``total_s``: the run's seconds, a resumed
    checkpoint's included (:class:`grpolab.run_clock.RunClock`). ``interrupted``: training stopped before its
    last step (default: a stop was requested);
    ``"signal"`` and ``"stopped_in"`` (the phase) record any stop, also one after training."""
    out = Path(cfg.paths.output_dir)
    trainer, module, stop = parts["trainer"], parts["module"], parts["stop"]
    summary = summarize(cfg, parts["algo"], module, parts["datamodule"], total_s)
    summary.update(interrupted=bool(stop.signum) if interrupted is None else interrupted,
                   signal=signal.Signals(stop.signum).name if stop.signum else None,
                   stopped_in=stop.stopped_in if stop.signum else None)
    summary.update(world_size=int(trainer.world_size), **count_parameters(module.policy))
    summary.update(final, memory_plan=parts["memory_plan"])
    summary.update(summary_keys(parts.get("failure"), parts["datamodule"].sampler.restarts))
    if trainer.is_global_zero:  # under DDP/FSDP only rank 0 writes the run folder
        RunFolder(out).write_summary(summary)  # atomic: a reader never sees half of it
    saving = bool(cfg.save_policy) and save_policy
    if saving:  # every rank takes part (FSDP gathers the shards), rank 0 writes
        save_policy_files(module.policy, module.tokenizer, out / "policy", write=trainer.is_global_zero)
    if trainer.is_global_zero:
        log.info(closing_line(summary, out, saving))
    return summary


def closing_line(summary: dict, out: Path, saved_policy: bool) -> str:
    """The run's last console line, for a person: steps and time, held-out accuracy start -> end (and the final
    eval's score), where the policy and ``summary.json`` are. A stopped run says so; the resume command is printed
    by the stop itself (:mod:`grpolab.callbacks.interrupt`)."""
    def acc(key: str) -> str:
        return "n/a" if summary.get(key) is None else f"{summary[key]:.3f}"

    head = (f"stopped by {summary['signal']} after {summary['steps']} steps" if summary.get("interrupted")
            else f"done: {summary['steps']} steps")
    parts = [f"{head} in {summary.get('time_total_s', 0):.0f} s ({summary.get('time_train_s', 0):.0f} s of it "
             "training; the rest builds the models, or a warm start, and validates)",
             f"held-out accuracy {acc('val_accuracy_start')} -> {acc('val_accuracy_end')}"]
    parts += [f"{k} {summary[k]:.3f}" for k in summary if k.endswith("_mean_at_16") and summary[k] is not None]
    if saved_policy:
        parts.append(f"policy: {out / 'policy'}")
    parts.append(f"summary: {out / 'summary.json'}")
    return "; ".join(parts)


def run_final_eval(cfg: DictConfig, module: GRPOModule, dm: RolloutDataModule, task: Any, out: Path,
                   write: bool = True, should_stop: Any = None) -> dict:
    """``final_eval.enabled``: score the final policy (mean@n on ``final_eval.split``), write ``final_eval.json``
    (with per-prompt fractions) and return the summary keys (``test_mean_at_16``, ``test_mean_at_16_se``, ...).
    ``should_stop``: called after each batch; True abandons the eval (raises ``FinalEvalStopped``)."""
    fe = cfg.get("final_eval")
    if not fe or not fe.get("enabled"):
        return {}
    t0 = time.perf_counter()
    # the validation producer samples the live policy (also when the training sampler owns a stale copy)
    result = final_eval(module.policy, dm.validation_producer, task, split=fe.split, num_samples=fe.num_samples,
                        max_prompts=fe.get("max_prompts"), batch_size=fe.batch_size, seed=fe.seed,
                        should_stop=should_stop, ks=fe.get("ks"))
    result = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.items()}  # NaN -> null
    result["final_eval_s"] = round(time.perf_counter() - t0, 2)
    if write:  # under DDP every rank scores (the same samples), rank 0 writes
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "final_eval.json", result)
    log.info("final eval: %s", {k: v for k, v in result.items() if k != "per_prompt"})
    return {k: v for k, v in result.items() if k != "per_prompt"}


def summarize(cfg: DictConfig, algo: GRPOConfig, module: GRPOModule, dm: RolloutDataModule, total_s: float) -> dict:
    hist = module.val_history
    # "start" is the step-0 measurement only (val.at_start); with at_start=false it is null, not a later step
    first = next((h for h in hist if h["step"] == 0), {})
    last = hist[-1] if hist else {}
    # Under DDP/FSDP each rank counts what it sampled: its training rows, and the whole held-out set (every rank
    # validates all of it), so validation completions count once per rank in the sum.
    rollout = dm.summary()
    rollout.update(sum_over_ranks(module.trainer.strategy, {k: rollout[k] for k in RANK_COUNTERS}))
    return {
        "val_accuracy_start": first.get("accuracy"),
        "val_accuracy_end": last.get("accuracy"),
        "val_greedy_accuracy_start": first.get("greedy_accuracy"),
        "val_greedy_accuracy_end": last.get("greedy_accuracy"),
        "val_best_accuracy": max((h["accuracy"] for h in hist), default=None),
        "val_history": hist,
        "steps": int(module.global_step),
        **rollout,
        "time_total_s": round(total_s, 2),
        "time_train_s": round(module.time_train_s, 2),
        "skipped_optimizer_steps": module.skipped_steps,
        **algo.summary(),
        "seed": int(cfg.seed),
        "data_seed": OmegaConf.select(cfg, "data.seed"),
        "model": str(cfg.model._target_),
        "data": str(cfg.data._target_),
    }
