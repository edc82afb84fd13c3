"""What a sampler engine costs the training process: the engine's half of the memory plan.

Every engine declares its own needs with :meth:`~grpolab.rollout.engines.base.GenerationEngine.memory_needs`, from
its constructor arguments (the ``rollout`` node) and a :class:`GenerationShape` (what the run asks of a sampler);
the plan (:mod:`grpolab.app.plan_from_config`, :mod:`grpolab.plan.memory`) only adds the numbers of the
:class:`SamplerMemory` it gets back, so an engine added later plans its memory without any edit to the plan.

Pure arithmetic on integers, like :mod:`grpolab.plan.memory`: nothing here imports torch or an engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpolab.plan.memory import DECODE_LOGIT_COPIES, ModelShape, kv_cache_bytes, parameter_count


@dataclass(frozen=True)
class GenerationShape:
    """What a run asks of its sampler, per training process, read from the config alone (no model is built).

    Attributes:
        model: the policy's shape.
        weight_bytes: bytes per weight of the policy (2 or 4: ``model.dtype`` under ``trainer.precision``).
        policy_bytes: the policy's weights in bytes, LoRA adapters included: what a torch copy of it holds.
        compute_bytes: bytes per KV-cache element (2 under 16-bit compute, else 4).
        train_rows: sequences one sampler refresh generates on this process
            (``algo.per_device_train_batch_size x algo.steps_per_generation``).
        eval_rows: sequences of one held-out batch (``val.batch_size x val.num_generations``, or the final
            evaluation's ``batch_size x num_samples`` when larger); 0 = none.
        tokens: prompt + completion tokens per sequence.
        async_generation: generation overlaps training (``rollout.async_generation``).
        on_gpu: the trainer runs on a GPU (``trainer.accelerator``).
        device_bytes: one device's memory in bytes when known (the GPU's, or ``plan.device_memory``), else None.
    """

    model: ModelShape
    weight_bytes: int = 4
    policy_bytes: int = 0
    compute_bytes: int = 4
    train_rows: int = 64
    eval_rows: int = 0
    tokens: int = 512
    async_generation: bool = False
    on_gpu: bool = False
    device_bytes: int | None = None

    @property
    def weight_copy_bytes(self) -> int:
        """The base weights without adapters (a LoRA policy merged, as an inference engine receives it), bytes."""
        return parameter_count(self.model) * self.weight_bytes


def decode_cache_bytes(shape: GenerationShape, rows: int) -> int:
    """A decode loop's memory on the training device while ``rows`` sequences are generated at once: the KV cache
    of ``shape.tokens`` positions (:func:`~grpolab.plan.memory.kv_cache_bytes`, ``compute_bytes`` per element) and
    one decode step's float32 logits, :data:`~grpolab.plan.memory.DECODE_LOGIT_COPIES` copies of ``rows x vocab``.

    Returns:
        Bytes; 0 when ``rows`` is 0.
    """
    if rows <= 0:
        return 0
    m = shape.model
    return kv_cache_bytes(m, rows, shape.tokens, shape.compute_bytes) + rows * m.vocab_size * 4 * DECODE_LOGIT_COPIES


@dataclass(frozen=True)
class SamplerMemory:
    """A sampler's memory needs, in bytes per training process (what ``memory_needs`` returns).

    Attributes:
        weights_bytes: the engine's own copy of the weights; 0 = it samples on the live policy (nothing to copy).
        cache_bytes: its KV-cache budget (with the decode logits for a decode loop).
        cache_reserved: True when the cache is allocated when the engine starts and held for the run (vLLM);
            False when it exists only while generating (a decode loop: the plan's ``kv_cache`` term, which overlaps
            training only with asynchronous generation).
        generation_rows: sequences decoded at once.
        on_trainer_device: False for a sampler on its own devices (a server): its weights and cache cost the
            training process nothing; only ``kept_bytes`` and ``eval_cache_bytes`` count.
        kept_bytes: a host copy of the last push kept for checkpoints with a buffer in flight (async generation).
        eval_cache_bytes: the decode memory of held-out sampling (validation and final evaluation run on
            ``validation_engine()``, on the live policy, ``GenerationShape.eval_rows`` sequences at once).
        knobs: the settings that shrink the sampler's own terms, for the plan's refusal and verdict, each starting
            with its config key; ``key=value`` ones are tried by the verdict (``rollout.generation_batch_size=16``).
        cache_knobs: the same for the generation cache (the plan's ``kv_cache`` term).
        notes: lines printed under the plan's table.
    """

    weights_bytes: int = 0
    cache_bytes: int = 0
    cache_reserved: bool = False
    generation_rows: int = 0
    on_trainer_device: bool = True
    kept_bytes: int = 0
    eval_cache_bytes: int = 0
    knobs: tuple[str, ...] = ()
    cache_knobs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def resident_bytes(self) -> int:
        """Held by the training process for the whole run (the plan's ``sampler`` term): the copy, a reserved
        cache and the kept push; only the kept push for a sampler on its own devices."""
        held = self.weights_bytes + (self.cache_bytes if self.cache_reserved else 0)
        return (held if self.on_trainer_device else 0) + self.kept_bytes

    @property
    def generation_bytes(self) -> int:
        """Held only while generating (the plan's ``kv_cache`` term): the larger of the sampler's decode cache (on
        the training device, not reserved) and held-out sampling's."""
        own = self.cache_bytes if self.on_trainer_device and not self.cache_reserved else 0
        return max(own, self.eval_cache_bytes)
