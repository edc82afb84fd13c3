"""Small helpers for multi-process training on existing engines (PyTorch DDP / FSDP2 through Lightning).

Nothing here implements data parallelism: it reads full weights out of a wrapped or sharded policy, one
module at a time, and checks the trainer config. How the loss is normalised across ranks is declared by each
aggregation (:func:`grpolab.algo.aggregation.step_denominator`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from grpolab.errors import ConfigError


def sum_over_ranks(strategy: Any, counts: dict[str, int]) -> dict[str, int]:
    """``counts`` summed over every data-parallel rank with one all-reduce; a copy of ``counts`` with one process.

    A collective: every rank must call it with the same keys.

    Args:
        strategy: the Lightning strategy (``world_size``, ``root_device``, ``reduce``).
        counts: name -> int count of this rank (exact up to 2**53).

    Returns:
        name -> the sum over ranks (int).
    """
    return {k: int(round(v)) for k, v in sum_floats_over_ranks(strategy, counts).items()}


def sum_floats_over_ranks(strategy: Any, values: dict[str, float]) -> dict[str, float]:
    """``values`` summed over every data-parallel rank with one float64 all-reduce; a copy with one process
    (:func:`reduce_floats_over_ranks` with ``op="sum"``)."""
    return reduce_floats_over_ranks(strategy, values)


def reduce_floats_over_ranks(strategy: Any, values: dict[str, float], op: str = "sum") -> dict[str, float]:
    """``values`` combined over every data-parallel rank with one float64 all-reduce; a copy with one process.

    The tensor is built on ``strategy.root_device``: a process group on GPUs is NCCL-only and has no backend for
    a CPU tensor ("No backend type associated with device type cpu"). A collective: every rank must call it with
    the same keys and ``op``.

    Args:
        strategy: the Lightning strategy (``world_size``, ``root_device``, ``reduce``).
        values: name -> this rank's value.
        op: ``"sum"``, ``"max"`` or ``"min"``.

    Returns:
        name -> the combined value over ranks (float).

    Raises:
        ValueError: another ``op``.
    """
    if op not in ("sum", "max", "min"):
        raise ValueError(f"op must be sum, max or min, got {op!r}")
    if getattr(strategy, "world_size", 1) <= 1:
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)
    local = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=strategy.root_device)
    total = strategy.reduce(local, reduce_op=op).cpu().tolist()
    return dict(zip(keys, total, strict=True))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP (``.module``) wrapper; other modules are returned as they are."""
    while isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model


def _full(t: Tensor) -> Tensor:
    full_tensor = getattr(t, "full_tensor", None)  # a DTensor shard of FSDP2 (fully_shard): all-gather it
    return full_tensor() if callable(full_tensor) else t


@torch.no_grad()
def iter_full_parameters(model: torch.nn.Module, include_buffers: bool = False) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(name, full tensor)`` for every parameter, gathering ONE module's tensors at a time.

    For a rollout engine's weight sync: the whole model is never materialised at once on one rank. Works
    for a plain module, a DDP-wrapped one (names without ``module.``) and an FSDP2 (``fully_shard``) one,
    whose DTensor shards are all-gathered module by module (every rank must iterate: it is a collective).
    Tied parameters are yielded once, under their first name.

    Args:
        model: the policy (plain, DDP or FSDP2).
        include_buffers: also yield buffers (e.g. rotary ``inv_freq``).

    Yields:
        ``(qualified name, tensor)``; the tensor is a full, detached tensor on the parameter's device
        (a gathered copy for FSDP2, the parameter itself otherwise).

    Raises:
        TypeError: for an FSDP1 ``FullyShardedDataParallel`` model (use ``trainer=fsdp``, which is FSDP2).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = unwrap(model)
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise TypeError("iter_full_parameters supports plain, DDP and FSDP2 (fully_shard) modules, not FSDP1")
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        tensors = list(module.named_parameters(recurse=False))
        if include_buffers:
            tensors += list(module.named_buffers(recurse=False))
        for name, t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            yield (f"{prefix}.{name}" if prefix else name), _full(t).detach()


def is_sharded(model: torch.nn.Module) -> bool:
    """True when ``model`` holds FSDP2 (DTensor) parameters."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def shard_models(policy: torch.nn.Module, reference: torch.nn.Module | None, mesh: object) -> None:
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) over the data-parallel ranks of ``mesh`` (Lightning's
    ``ModelParallelStrategy`` device mesh): each decoder layer is one unit, the rest of the model the root.

    ``generate`` is registered as an FSDP forward method and the model is marked FSDP-managed, so Hugging Face
    ``generate`` runs with ``synced_gpus`` (every rank keeps stepping until all ranks have finished, as the
    per-layer all-gathers are collectives). A reference model that is a separate copy is sharded the same way;
    the LoRA reference (adapters disabled) shares the policy and needs nothing.

    Args:
        policy: the Hugging Face causal LM or its PEFT wrapper.
        reference: the frozen reference model or None.
        mesh: a ``DeviceMesh``; its ``data_parallel`` dimension is used when named.
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    names = getattr(mesh, "mesh_dim_names", None) or ()
    dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
    for model in (policy, reference):
        if model is None or not any(True for _ in model.named_parameters()) or is_sharded(model):
            continue
        base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        for layer in [m for m in base.modules() if type(m).__name__.endswith("DecoderLayer")]:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(base, mesh=dp_mesh)
        register_fsdp_forward_method(base, "generate")
        base._is_fsdp_managed_module = True  # transformers: generate(synced_gpus=True) across ranks


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The full (unsharded) state dict on CPU; a collective for FSDP2 models (call it on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def check_devices(accelerator: str | None, devices: object, num_nodes: int = 1) -> None:
    """Fail early, naming ``trainer.devices``, when more devices are asked for than this node has.

    CPU processes are limited to ``os.cpu_count()`` (one core per rank at least); GPUs to
    ``torch.cuda.device_count()``. ``devices`` may be an int, ``"auto"``, ``-1`` or a list of ids.

    Raises:
        ValueError: naming ``trainer.devices`` (or ``trainer.num_nodes``) and what the machine has.
    """
    if not (isinstance(num_nodes, int) and num_nodes >= 1):
        raise ConfigError(f"trainer.num_nodes must be an int >= 1, got {num_nodes!r}")
    if devices in ("auto", -1, "-1", None):
        return
    if isinstance(devices, str):
        try:
            devices = int(devices)
        except ValueError:
            devices = [d for d in devices.split(",") if d.strip()]
    count = len(devices) if isinstance(devices, (list, tuple)) else devices
    if not (isinstance(count, int) and count >= 1):
        raise ConfigError(f"trainer.devices must be an int >= 1, a list of ids, 'auto' or -1, got {devices!r}")
    acc = (accelerator or "auto").lower()
    gpus = torch.cuda.device_count()
    if acc in ("gpu", "cuda") or (acc == "auto" and gpus > 0):
        if count > gpus:
            raise ConfigError(f"trainer.devices={count} but this machine has {gpus} GPU(s) "
                              f"(torch.cuda.device_count()); lower trainer.devices or use more nodes "
                              f"(trainer.num_nodes)")
    elif acc == "cpu":
        cpus = os.cpu_count() or 1
        if count > cpus:
            raise ConfigError(f"trainer.devices={count} CPU processes but this machine has {cpus} cores "
                              f"(os.cpu_count()); lower trainer.devices")


def check_trainer(trainer: Any, export_lora: bool = False, engine: Any = None) -> None:
    """Check the ``trainer`` config against this machine before any model is built.

    Covers ``trainer.devices`` (:func:`check_devices`), ``trainer=fsdp`` (torch.distributed with gloo on
    CPU or nccl on GPU) and ``trainer=deepspeed`` (the ``deepspeed`` package, GPUs).

    Args:
        trainer: the ``trainer`` config node (mapping with ``accelerator``, ``devices``, ``num_nodes``,
            ``strategy``).
        export_lora: a LoRA policy will be exported (``model.lora.r`` and ``save_policy``).
        engine: the rollout engine class (:class:`~grpolab.rollout.engines.base.GenerationEngine`); FSDP needs one whose
            ``supports_sharded_policy`` is true.

    Raises:
        ValueError: naming the key and saying what to use instead.
    """
    accelerator = trainer.get("accelerator")
    check_devices(accelerator, trainer.get("devices"), trainer.get("num_nodes", 1))
    strategy = trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if hasattr(strategy, "get") else str(strategy or "")
    on_gpu = str(accelerator).lower() in ("gpu", "cuda")
    if "ModelParallelStrategy" in target or target in ("fsdp", "fsdp2"):
        import torch.distributed as dist

        backend_ok = dist.is_available() and (dist.is_nccl_available() if on_gpu else dist.is_gloo_available())
        if not backend_ok:
            raise ConfigError(f"trainer=fsdp cannot run here: this torch build has no torch.distributed "
                              f"{'nccl' if on_gpu else 'gloo'} backend; use trainer=ddp or a single process "
                              f"(trainer=cpu / trainer=gpu)")
        if engine is not None and not engine.supports_sharded_policy:
            raise ConfigError(f"trainer=fsdp cannot be used with {engine.__name__} (it cannot take its weights from a "
                              f"sharded policy); use rollout=hf, or trainer=ddp with this rollout")
        if export_lora:
            raise ConfigError("trainer=fsdp with model.lora.r cannot export the merged policy yet; use trainer=ddp "
                              "with LoRA (the adapters are small), or save_policy=false")
    if "DeepSpeed" in target or target.startswith("deepspeed"):
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("trainer=deepspeed needs the deepspeed package (pip install deepspeed) and GPUs; "
                              "without them use trainer=fsdp (FSDP2, also on CPU) or trainer=ddp")
        if not on_gpu:
            raise ConfigError("trainer=deepspeed runs on GPUs only (trainer.accelerator=gpu); on CPU use "
                              "trainer=fsdp or trainer=ddp")
