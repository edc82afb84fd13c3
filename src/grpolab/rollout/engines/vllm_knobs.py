"""The in-process vLLM engine's ``rollout.*`` knobs before any engine exists: their checks (``check_config``) and the
memory both vLLM engines declare to the plan (:meth:`GenerationEngine.memory_needs
<grpolab.rollout.engines.base.GenerationEngine.memory_needs>`). Pure: nothing imports vLLM."""

from __future__ import annotations

import math
import os
from typing import Any

from grpolab.errors import ConfigError
from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory, decode_cache_bytes

CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB when neither rollout.kv_cache_memory_bytes nor VLLM_CPU_KVCACHE_SPACE is set
SERVER_NOTE = "the sampler server's own memory is on its own devices: not planned here"


def check_vllm_knobs(args: dict[str, Any]) -> None:
    """Check ``rollout=vllm``'s knobs: ``gpu_memory_utilization`` in (0, 1], ``tensor_parallel_size`` >= 1,
    ``max_model_len`` >= 2, ``dtype``, ``kv_cache_memory_bytes`` > 0, ``sync_check_tolerance`` > 0, ``max_num_seqs``
    >= 1 (each may be null but the first two), ``enable_sleep_mode`` a bool.

    Raises:
        ConfigError: naming ``rollout.<key>``.
    """
    def positive_int(key: str, low: int) -> bool:
        v = args.get(key)
        return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= low)

    gmu, tp, tol = args.get("gpu_memory_utilization", 0.3), args.get("tensor_parallel_size", 1), \
        args.get("sync_check_tolerance")
    for ok, key, rule, value in (
            (isinstance(gmu, int | float) and not isinstance(gmu, bool) and 0 < gmu <= 1,
             "gpu_memory_utilization", "in (0, 1]", gmu),
            (isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1, "tensor_parallel_size", "an int >= 1", tp),
            (positive_int("max_model_len", 2), "max_model_len", "null or an int >= 2", args.get("max_model_len")),
            (args.get("dtype", "auto") in ("auto", "float32", "bfloat16", "float16"), "dtype",
             "auto|float32|bfloat16|float16", args.get("dtype")),
            (positive_int("kv_cache_memory_bytes", 1), "kv_cache_memory_bytes", "null or an int > 0",
             args.get("kv_cache_memory_bytes")),
            (tol is None or (isinstance(tol, int | float) and math.isfinite(tol) and tol > 0),
             "sync_check_tolerance", "null or a number > 0", tol),
            (positive_int("max_num_seqs", 1), "max_num_seqs", "null or an int >= 1", args.get("max_num_seqs")),
            (isinstance(args.get("enable_sleep_mode", False), bool), "enable_sleep_mode", "true or false",
             args.get("enable_sleep_mode"))):
        if not ok:
            raise ConfigError(f"rollout.{key} must be {rule}, got {value!r}")


def vllm_memory(args: dict[str, Any], shape: GenerationShape, own_devices: bool = False) -> SamplerMemory:
    """vLLM's memory, reserved when the engine starts and held for the run.

    On a GPU of known size (``shape.device_bytes``): its share, ``rollout.gpu_memory_utilization x device_bytes``
    (weights and KV cache together). Otherwise a copy of the merged weights (``shape.weight_copy_bytes``) plus its
    KV-cache space: ``rollout.kv_cache_memory_bytes``, on CPU ``VLLM_CPU_KVCACHE_SPACE`` GiB, else 1 GiB; with async
    generation the engine also keeps a CPU copy of the last push for checkpoints. Validation samples on the live
    policy with Hugging Face, every held-out row at once (``shape.eval_rows``).

    Args:
        args: the ``rollout`` node's engine arguments (``gpu_memory_utilization``, ``kv_cache_memory_bytes``).
        shape: what the run asks of the sampler.
        own_devices: a server on its own devices (``rollout=vllm_server``): its weights and cache cost the training
            process nothing; only the kept push (async) and validation count.

    Returns:
        :class:`~grpolab.plan.sampler_memory.SamplerMemory` in bytes per training process.
    """
    weights = shape.weight_copy_bytes
    share = shape.on_gpu and shape.device_bytes is not None and not own_devices
    if share:  # the share holds the weights and the KV cache
        total = int(float(args.get("gpu_memory_utilization", 0.3)) * shape.device_bytes)
        weights, kv = min(weights, total), max(total - weights, 0)
    else:
        kv = CPU_DEFAULT_KV_CACHE_BYTES
        if args.get("kv_cache_memory_bytes"):
            kv = int(args["kv_cache_memory_bytes"])
        elif os.environ.get("VLLM_CPU_KVCACHE_SPACE") and not shape.on_gpu:
            kv = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * (1 << 30))
    kept = shape.weight_copy_bytes if shape.async_generation and not share else 0
    if own_devices:
        knobs: tuple[str, ...] = ()
        notes = (SERVER_NOTE,)
    else:
        knobs = ("a lower rollout.gpu_memory_utilization (vLLM's share of the device)" if share else
                 "a smaller rollout.kv_cache_memory_bytes (vLLM's KV-cache space)",
                 "rollout=vllm_server (the sampler on its own devices)")
        notes = () if share else ("vLLM planned as a weight copy + its KV-cache space (rollout.kv_cache_memory_bytes, "
                                  "VLLM_CPU_KVCACHE_SPACE or 1 GiB; on GPU: the device's size is unknown here, see "
                                  "plan.device_memory)",)
    return SamplerMemory(weights_bytes=weights, cache_bytes=kv, cache_reserved=True, generation_rows=shape.train_rows,
                         on_trainer_device=not own_devices, kept_bytes=kept, knobs=knobs, notes=notes,
                         eval_cache_bytes=decode_cache_bytes(shape, shape.eval_rows))
