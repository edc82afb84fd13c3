"""The memory plan of a composed config: read it, log it, refuse a run that cannot fit, before any model is built.

:func:`check_memory_plan` runs in ``grpolab.app.preflight.preflight`` after the other config checks; :func:`print_plan` is
``src/train.py +plan_only=true`` (or ``plan.only=true``): the table and its verdict, then exit 0, loading nothing.
The arithmetic is in :mod:`grpolab.plan.memory`; the sampler's part is the engine's own
(:meth:`~grpolab.rollout.engines.base.GenerationEngine.memory_needs`: this module names no engine and reads none of
an engine's keys); the verdict and ``plan.device_memory`` are :mod:`grpolab.plan.verdict`. This module maps config
keys onto the plan and finds the memory the run can see.

The model's shape comes, without any download, from (first match): the ``model.architecture`` node with
``model.init=random``, ``model.path``'s ``config.json``, the ``model.architecture`` node
(``conf/model/qwen*.yaml``), the tiny models' own keys (their vocabulary from the character set or from
``model.tokenizer_path``'s files), or a local ``model.name_or_path`` folder. A model described by none of
these (a bare hub id) gets no plan: a line says so, and the run goes on.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.app.malloc import check_mmap_threshold
from grpolab.errors import ConfigError
from grpolab.plan.devices import available_memory, devices_per_node, on_gpu, precision_bytes, strategy_kind
from grpolab.plan.memory import (
    GIB,
    LINEAR_NAMES,
    SMALL_MODEL_TARGETS,
    MemoryPlan,
    ModelShape,
    PlanInputs,
    format_plan,
    lora_parameter_count,
    parameter_count,
    plan_memory,
)
from grpolab.plan.sampler_memory import GenerationShape
from grpolab.plan.verdict import fitting_settings, parse_size, verdict
from grpolab.random_init import check_init
from grpolab.rollout.schedule import Schedule
from grpolab.rollout.settings import split_rollout_config

log = logging.getLogger("grpolab.plan")

KNOBS = {  # term -> the settings that shrink it; each names its config key first (dropped when already in effect);
    # the engine adds its own for "sampler" and "kv_cache" (SamplerMemory.knobs, cache_knobs)
    "weights": ("trainer=fsdp (shards them over processes)", "model.dtype=bfloat16"),
    "optimizer": ("model.lora.r=16 (AdamW state for the adapters only)", "trainer=fsdp"),
    "gradients": ("model.lora.r=16", "trainer=fsdp"),
    "reference": ("algo.beta=0 (no reference model)", "model.lora.r=16 (the reference is the base, adapters off)"),
    "sampler": (),
    "ddp_buckets": ("model.lora.r=16", "trainer=fsdp"),
    "fsdp_gathered": ("model.lora.r=16",),
    "runtime": ("none (libraries and CUDA context)",),
    "activations": ("algo.micro_batch_size (e.g. 2)", "model.gradient_checkpointing=true",
                    "a shorter algo.max_completion_length"),
    "optimizer_step": ("algo.optimizer.fused=true",),
    "tied_embedding_grad": ("model.lora.r=16 (the embedding is frozen)",),
    "kv_cache": ("val.batch_size", "a shorter algo.max_completion_length"),
}


def _tokenizer_size(folder: Any) -> int | None:
    """``len(tokenizer)`` of a local tokenizer folder, read from its files (vocab + added tokens), or None."""
    if not folder or not Path(str(folder)).expanduser().is_dir():
        return None
    root = Path(str(folder)).expanduser()
    ids: set[int] = set()
    try:
        if (root / "tokenizer.json").exists():
            data = json.loads((root / "tokenizer.json").read_text())
            ids.update(int(i) for i in data["model"]["vocab"].values())
            ids.update(int(t["id"]) for t in data.get("added_tokens", []))
        elif (root / "vocab.json").exists():
            ids.update(int(i) for i in json.loads((root / "vocab.json").read_text()).values())
            if (root / "added_tokens.json").exists():
                ids.update(int(i) for i in json.loads((root / "added_tokens.json").read_text()).values())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return len(ids) or None


def _local_config(folder: Any) -> dict | None:
    path = Path(str(folder)).expanduser() / "config.json" if folder else None
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text())


def _from_json(values: dict, where: str) -> tuple[ModelShape | None, str]:
    try:  # a folder of another architecture (GPT-2's n_embd, ...) gets no plan rather than an error
        return ModelShape.from_mapping(values, where), where
    except ValueError as err:
        return None, f"{where} is not a Qwen2/Llama-style decoder config ({err})"


def model_shape(model: Any) -> tuple[ModelShape | None, str]:
    """The model's shape from the config alone (see the module docstring), and where it came from.

    Raises:
        ValueError: naming ``model.init``, or ``model.architecture.<key>`` for a bad size.
    """
    model = OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else dict(model)
    target = str(model.get("_target_", ""))
    if "init" in model:  # model.init / model.architecture named before the spec is instantiated
        check_init(model["init"], model.get("architecture"))
    if model.get("init") == "random":  # built from the architecture node (model.path then only serves the tokenizer)
        return ModelShape.from_mapping(model["architecture"], "model.architecture"), "model.architecture"
    if (found := _local_config(model.get("path"))) is not None:
        return _from_json(found, f"{model['path']}/config.json")
    if model.get("architecture"):
        return ModelShape.from_mapping(model["architecture"], "model.architecture"), "model.architecture"
    if target.endswith(("TinyCharModel", "TinyQwenModel")):
        if target.endswith("TinyCharModel"):
            from grpolab.char_tokenizer import build_char_tokenizer, char_vocab

            vocab = len(build_char_tokenizer(char_vocab(model.get("extra_chars"))))
        else:
            vocab = _tokenizer_size(model.get("tokenizer_path"))
            if vocab is None:
                return None, f"model.tokenizer_path={model.get('tokenizer_path')} is not a readable tokenizer folder"
        return ModelShape.from_mapping({**model, "vocab_size": vocab, "tie_word_embeddings": True}, "model"), "model"
    if (found := _local_config(model.get("name_or_path"))) is not None:
        return _from_json(found, f"{model['name_or_path']}/config.json")
    return None, "no model.architecture node and no local config.json (nothing is fetched to plan)"


def sampler_engine(rollout: Any) -> tuple[type, dict[str, Any]]:
    """The engine class a ``rollout`` node builds (its :meth:`async_engine` with ``rollout.async_generation=true``)
    and its arguments (the node without the schedule keys); nothing is built or checked."""
    from hydra.utils import get_class

    args, settings = split_rollout_config(OmegaConf.to_container(rollout, resolve=True))
    engine = get_class(str(args.get("_target_")))
    return (engine.async_engine() if settings.async_generation is True else engine), args


def _plan_settings(cfg: DictConfig) -> tuple[bool, int]:
    parse_size(OmegaConf.select(cfg, "plan.device_memory", default=None))  # a bad size, named, before anything
    check = OmegaConf.select(cfg, "plan.check", default=True)
    prompt_length = OmegaConf.select(cfg, "plan.prompt_length", default=256)
    if not isinstance(check, bool):
        raise ConfigError(f"plan.check must be true or false, got {check!r}")
    if not (isinstance(prompt_length, int) and not isinstance(prompt_length, bool) and prompt_length >= 1):
        raise ConfigError(f"plan.prompt_length must be an int >= 1, got {prompt_length!r}")
    return check, prompt_length


def plan_inputs(cfg: DictConfig, algo: Any, lora: Any, shape: ModelShape,
                device_bytes: int | None = None) -> tuple[PlanInputs, list[str]]:
    """Map the composed config onto :class:`~grpolab.plan.memory.PlanInputs`; also the assumptions made.

    Args:
        algo: the validated :class:`~grpolab.config.GRPOConfig`. lora: :class:`~grpolab.lora.LoraAdapterConfig`.
        device_bytes: one GPU's memory, for the engine's :class:`~grpolab.plan.sampler_memory.GenerationShape`
            (e.g. vLLM's ``gpu_memory_utilization`` share; None = unknown).
    """
    _, assumed_prompt = _plan_settings(cfg)
    trainer, model, rollout = cfg.trainer, cfg.model, cfg.rollout
    notes = []
    param_bytes, compute_bytes, autocast, adapter_bytes = precision_bytes(trainer.get("precision", "32-true"),
                                                                     str(model.get("dtype", "float32")))
    devices, nodes = devices_per_node(trainer), int(trainer.get("num_nodes", 1) or 1)
    world = devices * nodes
    strategy = strategy_kind(trainer, world)
    if "DeepSpeed" in str(OmegaConf.select(trainer, "strategy._target_", default="")):
        notes.append("trainer=deepspeed is planned as DDP (ZeRO partitioning not modelled)")
    target = OmegaConf.select(model, "_target_")
    if (not on_gpu(trainer) and target not in SMALL_MODEL_TARGETS
            and check_mmap_threshold(cfg.get("malloc_mmap_threshold", "auto"), target) is None):
        notes.append("malloc_mmap_threshold=null: glibc's heap may keep freed tensors resident beyond this plan "
                     "(Qwen2.5-1.5B LoRA with checkpointing: +37%); auto or 131072 keeps the plan")
    prompt = algo.max_prompt_length
    if prompt is None:
        context = OmegaConf.select(model, "architecture.max_position_embeddings") or model.get("max_position_embeddings")
        prompt = min(assumed_prompt, max(int(context) - algo.max_completion_length, 1)) if context else assumed_prompt
        notes.append(f"prompt length assumed {prompt} tokens (algo.max_prompt_length is null; plan.prompt_length)")
    val_prompts = int(OmegaConf.select(cfg, "val.batch_size", default=0) or 0)
    if isinstance(OmegaConf.select(cfg, "data.val_size"), int):  # fewer held-out prompts than a batch
        val_prompts = min(val_prompts, int(cfg.data.val_size))
    eval_rows = [val_prompts * int(OmegaConf.select(cfg, "val.num_generations", default=0) or 0)]
    if OmegaConf.select(cfg, "final_eval.enabled", default=False):
        eval_rows.append(int(cfg.final_eval.batch_size) * int(cfg.final_eval.num_samples))
    targets = lora.target_modules
    if targets != "all-linear" and [t for t in targets if t not in LINEAR_NAMES]:
        notes.append(f"LoRA targets {[t for t in targets if t not in LINEAR_NAMES]} are not Qwen2 projections: "
                     "not counted")
        targets = [t for t in targets if t in LINEAR_NAMES]
    checkpointing = bool(model.get("gradient_checkpointing", False))
    if checkpointing:
        notes.append("model.gradient_checkpointing=true: activations hold each layer's input and one layer recomputed "
                     "at a time (every row runs its whole prompt: no shared-prompt forward)")
    policy_bytes = parameter_count(shape) * param_bytes + (
        lora_parameter_count(shape, lora.r, targets) * adapter_bytes if lora.r else 0)
    engine, engine_args = sampler_engine(rollout)
    sampler = engine.memory_needs(engine_args, GenerationShape(
        model=shape, weight_bytes=param_bytes, policy_bytes=policy_bytes, compute_bytes=compute_bytes,
        train_rows=algo.per_device_train_batch_size * algo.steps_per_generation, eval_rows=max(eval_rows),
        tokens=int(prompt) + algo.max_completion_length, async_generation=rollout.get("async_generation") is True,
        on_gpu=on_gpu(trainer), device_bytes=device_bytes if on_gpu(trainer) else None))
    max_steps = trainer.get("max_steps")
    inputs = PlanInputs(
        shape=shape, param_bytes=param_bytes, compute_bytes=compute_bytes, autocast=autocast,
        adapter_bytes=adapter_bytes, lora_r=lora.r, lora_target_modules=targets, beta=algo.beta,
        fused_optimizer=bool(OmegaConf.select(cfg, "algo.optimizer.fused", default=False)), sampler=sampler,
        async_generation=rollout.get("async_generation") is True, completions_per_step=algo.per_device_train_batch_size,
        micro_batch_size=algo.micro_batch_size, num_generations=algo.num_generations, prompt_length=int(prompt),
        completion_length=algo.max_completion_length, gradient_checkpointing=checkpointing,
        shared_prompt_forward=algo.shared_prompt_forward, strategy=strategy, world_size=world,
        max_steps=int(max_steps) if isinstance(max_steps, int) and max_steps > 0 else None,
        steps_per_buffer=Schedule(algo.steps_per_generation, algo.num_iterations).steps_per_buffer)
    return inputs, notes


def make_plan(cfg: DictConfig, algo: Any, lora: Any) -> tuple[MemoryPlan | None, int | None, str]:
    """``(plan or None, bytes one process may use or None, a phrase)``: the phrase says where the budget comes
    from, or why there is no plan. ``plan.device_memory``, when set, is the budget (one device's size, per process)
    instead of what this machine has.

    Raises:
        ConfigError: naming ``plan.device_memory`` for a bad size.
    """
    shape, source = model_shape(cfg.model)
    if shape is None:
        return None, None, source
    processes = devices_per_node(cfg.trainer) if not on_gpu(cfg.trainer) else 1
    budget = parse_size(OmegaConf.select(cfg, "plan.device_memory", default=None))
    budget_source = "plan.device_memory"
    if budget is None:
        budget, budget_source = available_memory(cfg.trainer, processes)
    inputs, notes = plan_inputs(cfg, algo, lora, shape, budget if on_gpu(cfg.trainer) else None)
    plan = plan_memory(inputs)
    plan.notes = [f"shape from {source}", *notes, *plan.notes]
    return plan, budget, budget_source


def _in_effect(knob: str, cfg: DictConfig | None) -> bool:
    """True when ``cfg`` already has the setting a knob suggests (``model.dtype=bfloat16`` on a bf16 model, ...)."""
    if cfg is None:
        return False
    if knob.startswith("model.dtype=bfloat16"):
        return str(OmegaConf.select(cfg, "model.dtype")) == "bfloat16"
    if knob.startswith("model.gradient_checkpointing=true"):
        return bool(OmegaConf.select(cfg, "model.gradient_checkpointing", default=False))
    if knob.startswith("model.lora.r="):
        return OmegaConf.select(cfg, "model.lora.r") is not None
    if knob.startswith("algo.optimizer.fused=true"):
        return bool(OmegaConf.select(cfg, "algo.optimizer.fused", default=False))
    if knob.startswith("algo.beta=0"):
        return OmegaConf.select(cfg, "algo.beta") == 0
    return False


def _knob_list(term: str, cfg: DictConfig | None, plan: MemoryPlan | None) -> list[str]:
    engine = list(plan.knobs.get(term, ())) if plan is not None else []
    return [k for k in [*engine, *KNOBS[term]] if not _in_effect(k, cfg)]


def knobs(term: str, cfg: DictConfig | None = None, plan: MemoryPlan | None = None) -> str:
    """The settings that shrink ``term`` (the engine's own first, from ``plan.knobs``), without those ``cfg``
    already has (``none left`` when all are set)."""
    return ", ".join(_knob_list(term, cfg, plan)) or "none left in this config"


def _largest(plan: MemoryPlan, cfg: DictConfig | None) -> str:
    return "; ".join(f"{name} {value / GIB:.1f} GiB ({knobs(name, cfg, plan)})" for name, value in plan.largest(3))


def fits_with(cfg: DictConfig, plan: MemoryPlan) -> list[str]:
    """The settings that would each make ``plan`` fit on their own (:func:`~grpolab.plan.verdict.fitting_settings`:
    the config re-planned with each), with the peak each gives."""
    def replan(changed: DictConfig) -> tuple[int | None, int | None]:
        from grpolab.config import GRPOConfig
        from grpolab.lora import validate_lora

        algo = GRPOConfig.from_dict(OmegaConf.to_container(changed.algo, resolve=True))
        found, budget, _ = make_plan(changed, algo, validate_lora(changed.model.get("lora"), algo.ref_refresh_every))
        return (found.peak_bytes if found else None), budget

    candidates = [k for term, _ in plan.largest(len(plan.terms)) for k in _knob_list(term, cfg, plan)]
    return fitting_settings(cfg, candidates, replan)


def refusal_message(plan: MemoryPlan, budget: int, budget_source: str, cfg: DictConfig | None = None) -> str:
    """The error text: the plan against the budget, the settings that would each make it fit (with ``cfg``), the
    largest terms with the knobs that shrink them (those ``cfg`` already has left out)."""
    fits = "; ".join(fits_with(cfg, plan)) if cfg is not None else ""
    return (f"memory plan: {plan.peak_bytes / GIB:.1f} GiB per process exceeds the {budget / GIB:.1f} GiB this run "
            f"can see ({budget_source}); nothing was loaded. {f'It fits with, each alone: {fits}. ' if fits else ''}"
            f"Largest terms: {_largest(plan, cfg)}. Set plan.check=false to run anyway (the plan is an estimate; see "
            "the table above)")


def check_memory_plan(cfg: DictConfig, algo: Any, lora: Any) -> dict | None:
    """Log the plan as a table and stop when it exceeds the memory the run can see (``plan.check``). The plan is
    made once per run, here (``grpolab.app.preflight.preflight``), and carried to ``summary.json``.

    Returns:
        The plan as ``summary.json``'s ``memory_plan`` holds it (:meth:`MemoryPlan.to_dict` with
        ``available_bytes``), or None when the model's shape is not in the config.

    Raises:
        ValueError: the plan exceeds the budget and ``plan.check`` is true (naming the largest terms and the
            knobs that shrink them), or a ``plan.*`` / ``model.architecture.*`` value is invalid.
    """
    check, _ = _plan_settings(cfg)
    plan, budget, why = make_plan(cfg, algo, lora)
    if plan is None:
        log.info("memory plan: skipped (%s)", why)
        return None
    log.info("memory plan (bytes per process, before any model is built):\n%s", format_plan(plan, "", budget, why))
    if budget is not None and plan.peak_bytes > budget:
        if check:
            raise ConfigError(refusal_message(plan, budget, why, cfg))
        log.warning("memory plan exceeds the %s (%.1f GiB); plan.check=false: running anyway", why, budget / GIB)
    return {**plan.to_dict(), "available_bytes": budget}


def wants_plan_only(cfg: DictConfig) -> bool:
    """``+plan_only=true`` on the command line, or ``plan.only=true``."""
    return bool(cfg.get("plan_only", False)) or bool(OmegaConf.select(cfg, "plan.only", default=False))


def print_plan(cfg: DictConfig) -> MemoryPlan | None:
    """``plan_only``: validate the algo and LoRA settings, print the plan, load nothing (no model, tokenizer,
    data or hub access), and return; device checks that need the hardware are not run."""
    from grpolab.config import GRPOConfig
    from grpolab.lora import validate_lora

    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    lora = validate_lora(cfg.model.get("lora"), algo.ref_refresh_every)
    _plan_settings(cfg)
    plan, budget, why = make_plan(cfg, algo, lora)
    if plan is None:
        print(f"memory plan: none ({why})", flush=True)
        return None
    world = devices_per_node(cfg.trainer) * int(cfg.trainer.get("num_nodes", 1) or 1)
    header = (f"memory plan: model={OmegaConf.select(cfg, 'model.name_or_path') or cfg.model._target_} "
              f"trainer.precision={cfg.trainer.get('precision')} processes={world} (bytes per process)")
    fits = fits_with(cfg, plan) if budget is not None and plan.peak_bytes > budget else []
    lines = verdict(plan.peak_bytes, budget, why, fits, _largest(plan, cfg))
    print(format_plan(plan, header, budget, why) + "\n" + "\n".join(f"  {line}" for line in lines), flush=True)
    return plan
