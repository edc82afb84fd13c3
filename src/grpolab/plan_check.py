"""The memory plan of a composed config: read it, log it, refuse a run that cannot fit, before any model is built.

:func:`check_memory_plan` runs in ``grpolab.preflight.preflight`` after the other config checks; :func:`print_plan` is
``src/train.py +plan_only=true`` (or ``plan.only=true``): the table, then exit 0, loading nothing. The
arithmetic is in :mod:`grpolab.memory_plan`; this module maps config keys onto it and finds the memory the
run can see.

The model's shape comes, without any download, from (first match): the ``model.architecture`` node with
``model.init=random``, ``model.path``'s ``config.json``, the ``model.architecture`` node
(``conf/model/qwen*.yaml``), the tiny models' own keys (their vocabulary from the character set or from
``model.tokenizer_path``'s files), or a local ``model.name_or_path`` folder. A model described by none of
these (a bare hub id) gets no plan: a line says so, and the run goes on.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.errors import ConfigError
from grpolab.malloc import SMALL_MODEL_TARGETS, check_mmap_threshold
from grpolab.memory_plan import (
    GIB,
    LINEAR_NAMES,
    MemoryPlan,
    ModelShape,
    PlanInputs,
    format_plan,
    plan_memory,
)
from grpolab.random_init import check_init
from grpolab.rollout.schedule import Schedule

log = logging.getLogger("grpolab.plan")

KNOBS = {  # term -> the settings that shrink it; each names its config key first (dropped when already in effect)
    "weights": ("trainer=fsdp (shards them over processes)", "model.dtype=bfloat16"),
    "optimizer": ("model.lora.r=16 (AdamW state for the adapters only)", "trainer=fsdp"),
    "gradients": ("model.lora.r=16", "trainer=fsdp"),
    "reference": ("algo.beta=0 (no reference model)", "model.lora.r=16 (the reference is the base, adapters off)"),
    "sampler": ("rollout=hf (samples in place, no copy)", "a lower rollout.gpu_memory_utilization (vLLM)"),
    "ddp_buckets": ("model.lora.r=16", "trainer=fsdp"),
    "fsdp_gathered": ("model.lora.r=16",),
    "runtime": ("none (libraries and CUDA context)",),
    "activations": ("algo.micro_batch_size (e.g. 2)", "model.gradient_checkpointing=true",
                    "a shorter algo.max_completion_length"),
    "optimizer_step": ("algo.optimizer.fused=true",),
    "tied_embedding_grad": ("model.lora.r=16 (the embedding is frozen)",),
    "kv_cache": ("rollout.generation_batch_size (e.g. 16)", "val.batch_size", "a shorter algo.max_completion_length"),
}
_PRECISION_ALIASES = {"bf16": "bf16-mixed", "16": "16-mixed", "32": "32-true", "64": "64-true"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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
            from grpolab.models import CHAR_SPECIALS, CHAR_VOCAB

            vocab = len(CHAR_SPECIALS) + len(CHAR_VOCAB)
        else:
            vocab = _tokenizer_size(model.get("tokenizer_path"))
            if vocab is None:
                return None, f"model.tokenizer_path={model.get('tokenizer_path')} is not a readable tokenizer folder"
        return ModelShape.from_mapping({**model, "vocab_size": vocab, "tie_word_embeddings": True}, "model"), "model"
    if (found := _local_config(model.get("name_or_path"))) is not None:
        return _from_json(found, f"{model['name_or_path']}/config.json")
    return None, "no model.architecture node and no local config.json (nothing is fetched to plan)"


def _devices(trainer: Any) -> int:
    """Processes per node from ``trainer.devices`` (``auto``, -1 and unreadable values plan one; the run's own
    device check names a bad value)."""
    devices = trainer.get("devices", 1)
    if isinstance(devices, (list, tuple)) or (OmegaConf.is_list(devices)):
        return len(devices)
    if isinstance(devices, str):
        ids = [d for d in devices.split(",") if d.strip()]
        devices = len(ids) if len(ids) > 1 else (int(devices) if devices.strip().isdigit() else 1)
    return devices if isinstance(devices, int) and devices >= 1 else 1


def _strategy(trainer: Any, world: int) -> str:
    strategy = trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")
    if "ModelParallel" in target or "FSDP" in target or target.startswith("fsdp"):
        return "fsdp"
    if "DDP" in target or "DeepSpeed" in target or target.startswith(("ddp", "deepspeed")) or world > 1:
        return "ddp"
    return "single"


def _precision(precision: Any, model_dtype: str) -> tuple[int, int, bool, int]:
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


def _sampler_kind(rollout: Any) -> str:
    """``server`` (a sampler in another process, on its own devices), ``vllm`` (an inference engine holding its own
    weights outside torch), ``copy`` (a torch copy of the policy) or ``in_place``, from the engine's declared
    capabilities (after the async switch)."""
    from hydra.utils import get_class

    engine = get_class(str(rollout.get("_target_")))
    if rollout.get("async_generation") is True:
        engine = engine.async_engine()
    if engine.sampler_outside_trainer:
        return "server"
    if not engine.samples_from_module:
        return "vllm"
    return "copy" if engine.owns_weights else "in_place"


def _plan_settings(cfg: DictConfig) -> tuple[bool, int]:
    check = OmegaConf.select(cfg, "plan.check", default=True)
    prompt_length = OmegaConf.select(cfg, "plan.prompt_length", default=256)
    if not isinstance(check, bool):
        raise ConfigError(f"plan.check must be true or false, got {check!r}")
    if not (isinstance(prompt_length, int) and not isinstance(prompt_length, bool) and prompt_length >= 1):
        raise ConfigError(f"plan.prompt_length must be an int >= 1, got {prompt_length!r}")
    return check, prompt_length


def plan_inputs(cfg: DictConfig, algo: Any, lora: Any, shape: ModelShape,
                device_bytes: int | None = None) -> tuple[PlanInputs, list[str]]:
    """Map the composed config onto :class:`~grpolab.memory_plan.PlanInputs`; also the assumptions made.

    Args:
        algo: the validated :class:`~grpolab.config.GRPOConfig`. lora: :class:`~grpolab.lora.LoraSettings`.
        device_bytes: one GPU's memory, for vLLM's ``gpu_memory_utilization`` share (None = unknown).
    """
    _, assumed_prompt = _plan_settings(cfg)
    trainer, model, rollout = cfg.trainer, cfg.model, cfg.rollout
    notes = []
    param_bytes, compute_bytes, autocast, adapter_bytes = _precision(trainer.get("precision", "32-true"),
                                                                     str(model.get("dtype", "float32")))
    devices, nodes = _devices(trainer), int(trainer.get("num_nodes", 1) or 1)
    world = devices * nodes
    strategy = _strategy(trainer, world)
    if "DeepSpeed" in str(OmegaConf.select(trainer, "strategy._target_", default="")):
        notes.append("trainer=deepspeed is planned as DDP (ZeRO partitioning not modelled)")
    target = OmegaConf.select(model, "_target_")
    if (not on_gpu(trainer) and target not in SMALL_MODEL_TARGETS
            and check_mmap_threshold(cfg.get("malloc_mmap_threshold", "auto"), target) is None):
        notes.append("malloc_mmap_threshold=null: glibc's heap may keep freed tensors resident beyond this plan "
                     "(Qwen2.5-1.5B LoRA with checkpointing: +37%); auto or 131072 keeps the plan")
    sampler = _sampler_kind(rollout)
    prompt = algo.max_prompt_length
    if prompt is None:
        context = OmegaConf.select(model, "architecture.max_position_embeddings") or model.get("max_position_embeddings")
        prompt = min(assumed_prompt, max(int(context) - algo.max_completion_length, 1)) if context else assumed_prompt
        notes.append(f"prompt length assumed {prompt} tokens (algo.max_prompt_length is null; plan.prompt_length)")
    cap = rollout.get("generation_batch_size") if sampler not in ("vllm", "server") else None
    train_rows = 0 if sampler in ("vllm", "server") else algo.per_device_train_batch_size * algo.steps_per_generation
    val_prompts = int(OmegaConf.select(cfg, "val.batch_size", default=0) or 0)
    if isinstance(OmegaConf.select(cfg, "data.val_size"), int):  # fewer held-out prompts than a batch
        val_prompts = min(val_prompts, int(cfg.data.val_size))
    rows = [train_rows, val_prompts * int(OmegaConf.select(cfg, "val.num_generations", default=0) or 0)]
    if OmegaConf.select(cfg, "final_eval.enabled", default=False):
        rows.append(int(cfg.final_eval.batch_size) * int(cfg.final_eval.num_samples))
    hf_rows = min(max(rows), cap) if cap else max(rows)
    vllm_bytes, vllm_kv = None, GIB
    if sampler == "vllm":
        if on_gpu(trainer) and device_bytes is not None:
            vllm_bytes = int(float(rollout.get("gpu_memory_utilization", 0.3)) * device_bytes)
        elif rollout.get("kv_cache_memory_bytes"):
            vllm_kv = int(rollout.kv_cache_memory_bytes)
        elif os.environ.get("VLLM_CPU_KVCACHE_SPACE") and not on_gpu(trainer):
            vllm_kv = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * GIB)
        if vllm_bytes is None:
            notes.append("vLLM planned as a weight copy + its KV-cache space (rollout.kv_cache_memory_bytes, "
                         "VLLM_CPU_KVCACHE_SPACE or 1 GiB; on GPU: device memory unknown here)")
    targets = lora.target_modules
    if targets != "all-linear" and [t for t in targets if t not in LINEAR_NAMES]:
        notes.append(f"LoRA targets {[t for t in targets if t not in LINEAR_NAMES]} are not Qwen2 projections: "
                     "not counted")
        targets = [t for t in targets if t in LINEAR_NAMES]
    max_steps = trainer.get("max_steps")
    inputs = PlanInputs(
        shape=shape, param_bytes=param_bytes, compute_bytes=compute_bytes, autocast=autocast,
        adapter_bytes=adapter_bytes, lora_r=lora.r, lora_target_modules=targets, beta=algo.beta,
        fused_optimizer=bool(OmegaConf.select(cfg, "algo.optimizer.fused", default=False)), sampler=sampler,
        async_generation=rollout.get("async_generation") is True, vllm_bytes=vllm_bytes, vllm_kv_bytes=vllm_kv,
        completions_per_step=algo.per_device_train_batch_size, micro_batch_size=algo.micro_batch_size,
        num_generations=algo.num_generations, generation_rows=hf_rows, prompt_length=int(prompt),
        completion_length=algo.max_completion_length,
        gradient_checkpointing=bool(model.get("gradient_checkpointing", False)),
        shared_prompt_forward=algo.shared_prompt_forward, strategy=strategy, world_size=world,
        max_steps=int(max_steps) if isinstance(max_steps, int) and max_steps > 0 else None,
        steps_per_buffer=Schedule(algo.steps_per_generation, algo.num_iterations).steps_per_buffer)
    return inputs, notes


def make_plan(cfg: DictConfig, algo: Any, lora: Any) -> tuple[MemoryPlan | None, int | None, str]:
    """``(plan or None, bytes one process may use or None, a phrase)``: the phrase says where the budget comes
    from, or why there is no plan."""
    shape, source = model_shape(cfg.model)
    if shape is None:
        return None, None, source
    processes = _devices(cfg.trainer) if not on_gpu(cfg.trainer) else 1
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
    if knob.startswith("rollout=hf "):
        return str(OmegaConf.select(cfg, "rollout._target_", default="")).endswith("HFGenerationEngine")
    return False


def knobs(term: str, cfg: DictConfig | None = None) -> str:
    """The settings that shrink ``term``, without those ``cfg`` already has (``none left`` when all are set)."""
    left = [k for k in KNOBS[term] if not _in_effect(k, cfg)]
    return ", ".join(left) or "none left in this config"


def refusal_message(plan: MemoryPlan, budget: int, budget_source: str, cfg: DictConfig | None = None) -> str:
    """The error text: the plan against the budget, the largest terms with the knobs that shrink them (those
    ``cfg`` already has left out)."""
    terms = "; ".join(f"{name} {value / GIB:.1f} GiB ({knobs(name, cfg)})" for name, value in plan.largest(3))
    return (f"memory plan: {plan.peak_bytes / GIB:.1f} GiB per process exceeds the {budget / GIB:.1f} GiB this run "
            f"can see ({budget_source}); nothing was loaded. Largest terms: {terms}. Set plan.check=false to run "
            "anyway (the plan is an estimate; see the table above)")


def check_memory_plan(cfg: DictConfig, algo: Any, lora: Any) -> MemoryPlan | None:
    """Log the plan as a table and stop when it exceeds the memory the run can see (``plan.check``).

    Returns:
        The plan, or None when the model's shape is not in the config.

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
    return plan


def plan_summary(cfg: DictConfig) -> dict | None:
    """``summary.json``'s ``memory_plan``: the plan logged before the run (recomputed from the config, so the
    same numbers), with ``available_bytes``; None without a known shape."""
    from grpolab.config import GRPOConfig
    from grpolab.lora import LoraSettings

    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    plan, budget, _ = make_plan(cfg, algo, LoraSettings.from_dict(cfg.model.get("lora")))
    return None if plan is None else {**plan.to_dict(), "available_bytes": budget}


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
    world = _devices(cfg.trainer) * int(cfg.trainer.get("num_nodes", 1) or 1)
    header = (f"memory plan: model={OmegaConf.select(cfg, 'model.name_or_path') or cfg.model._target_} "
              f"trainer.precision={cfg.trainer.get('precision')} processes={world} (bytes per process)")
    print(format_plan(plan, header, budget, why), flush=True)
    return plan
