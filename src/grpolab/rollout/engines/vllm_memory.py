"""The memory the vLLM engines declare to the plan (:meth:`GenerationEngine.memory_needs
<grpolab.rollout.engines.base.GenerationEngine.memory_needs>`), from their ``rollout.*`` knobs alone: pure
arithmetic, nothing imports vLLM."""

from __future__ import annotations

import os
from typing import Any

from grpolab.sampler_memory import GenerationShape, SamplerMemory, decode_cache_bytes

CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB when neither rollout.kv_cache_memory_bytes nor VLLM_CPU_KVCACHE_SPACE is set
SERVER_NOTE = "the sampler server's own memory is on its own devices: not planned here"


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
        :class:`~grpolab.sampler_memory.SamplerMemory` in bytes per training process.
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
