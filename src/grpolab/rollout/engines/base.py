"""The generation engine interface: what the rest of grpolab may ask of a sampler.

An engine turns prompt token ids into sampled completions. :class:`GenerationEngine` declares every capability
the data module, the refresh strategies, the settings checks and the evaluator use, each with a default, so
adding an engine is one file (a subclass) plus one yaml in ``conf/rollout/`` whose ``_target_`` names it.
Nothing outside an engine inspects its class or probes it for attributes.

The engines that ship: :class:`~grpolab.rollout.engines.hf.HFGenerationEngine` (in place, on the live policy),
:class:`~grpolab.rollout.engines.hf_copy.HFSamplerCopyEngine` (a private copy of the policy) and
:class:`~grpolab.rollout.engines.vllm.VLLMGenerationEngine` (an in-process vLLM engine).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory, decode_cache_bytes


@dataclass
class SamplingParams:
    """How to sample. ``top_k=0`` and ``top_p=1.0`` disable truncation, which training requires: the trainer's
    log-probs apply the temperature only, so a truncated sampler would make the lag-0 ratio differ from 1.

    ``return_log_probs`` asks an engine that does not report log-probs by itself for the log-probs of the
    sampled tokens under the distribution it sampled from (``Generation.sampler_logp``): the producer asks for
    them when a minibatch needs log alpha and the engine does not recompute it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    do_sample: bool = True
    return_log_probs: bool = False
    # Sampling RNG. None = torch's global RNG. A background sampler passes its own generator so that it never
    # touches the RNG the trainer uses concurrently; the draws are the same as with the global RNG seeded alike.
    generator: torch.Generator | None = None


@dataclass
class Generation:
    """One generated batch; row ``i`` continues prompt ``i``.

    Attributes:
        prompt_ids: [B, P] long, left-padded prompts.
        prompt_mask: [B, P] long, 1 on real prompt tokens.
        completion_ids: [B, L] long, as sampled; positions after the first stop token hold padding.
        completion_mask: [B, L] bool, 1 up to and including the first stop token (the pad id may itself be a
            stop id, so the mask is computed on the unpadded tokens).
        truncated: [B] bool, True when no stop token was sampled within ``max_new_tokens``.
        sampler_logp: [B, L] float32 or None, the log-probs the engine reports for each sampled completion
            token under the distribution it sampled from (the tempered softmax: vLLM's ``processed_logprobs``,
            the decode loop's ``log_softmax(logits / T)``; untempered for a greedy Hugging Face call), 0
            outside ``completion_mask``; the producer stores them as log alpha unless the engine recomputes it.
            Engines with ``reports_sampler_logp``: always when sampling, None when greedy. Others: only with
            ``SamplingParams.return_log_probs``.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    sampler_logp: torch.Tensor | None = None


class GenerationEngine(ABC):
    """A sampler: ``generate`` completions, and receive the policy's weights at every sampler refresh.

    ``sync_weights`` is called once per sampler refresh (every ``steps_per_generation`` optimizer steps): an
    engine that holds its own copy of the weights (``owns_weights``) loads the policy's weights there, and
    ``generate`` then samples from that copy, ignoring the live ``model`` it is passed. An in-place engine samples
    from ``model``. Either samples with the settings of ``params`` alone: nothing from the model's own generation
    config may change the distribution, because the trainer stores the log-probs of exactly that tempered,
    untruncated distribution.

    Capabilities (class attributes, read before any engine is built):
        owns_weights: samples from its own copy of the weights, refreshed only by :meth:`sync_weights`. Needed by
            ``rollout.async_generation`` (the policy trains while the sampler samples). Such an engine must
            implement :meth:`sync_weights`, :meth:`sampler_state_dict`, :meth:`load_sampler_state_dict` and
            :meth:`validation_engine` (its copy may be up to k - 1 steps old, so held-out accuracy must be measured
            by an engine on the live policy); a class that does not is refused when it is defined (``TypeError``).
        reports_sampler_logp: every sampled :class:`Generation` carries the engine's own log-probs, whether asked
            or not (an inference engine's; ``algo.vllm_importance_sampling_correction`` needs them).
        samples_from_module: the sampler's weights live in a torch module of this process (the live policy, or
            :meth:`sampler_module`), so a trainer forward on them can recompute log alpha. False for an inference
            engine: with ``rollout.async_generation`` its own log-probs must then be log alpha.
        supports_sharded_policy: the engine can take its weights from an FSDP-sharded policy (``trainer=fsdp``).

    Its memory: :meth:`memory_needs` (a class method, read by the memory plan before any model is built).

    Instance attribute:
        recompute_sampler_logp: log alpha comes from a trainer forward in the training pass's micro-batch shapes
            (lag-0 ratio exactly 1) rather than from the log-probs recorded while sampling.
    """

    owns_weights: ClassVar[bool] = False
    reports_sampler_logp: ClassVar[bool] = False
    samples_from_module: ClassVar[bool] = True
    supports_sharded_policy: ClassVar[bool] = True
    recompute_sampler_logp: bool = True

    #: What an engine that owns its weights must implement (checked when its class is defined).
    OWNER_METHODS: ClassVar[tuple[str, ...]] = ("sync_weights", "sampler_state_dict", "load_sampler_state_dict",
                                                "validation_engine")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a class with ``owns_weights=True`` that leaves any of :attr:`OWNER_METHODS` to this interface.

        Raises:
            TypeError: naming the class and the missing methods.
        """
        super().__init_subclass__(**kwargs)
        if cls.owns_weights:
            missing = [name for name in GenerationEngine.OWNER_METHODS
                       if getattr(cls, name) is getattr(GenerationEngine, name)]
            if missing:
                raise TypeError(f"{cls.__module__}.{cls.__qualname__} owns its weights (owns_weights=True) and must "
                                f"implement {missing}: validation_engine() returns an engine on the live policy (its "
                                "own copy may be stale), the others push, save and restore its weights")

    # ------------------------------------------------------------------------------ class-level checks
    @classmethod  # noqa: B027 - an optional capability, empty by default
    def check_installed(cls) -> None:
        """Raise ``ImportError`` naming the install command when a dependency is missing (called before any model
        is built). Default: nothing is missing."""

    @classmethod  # noqa: B027 - an optional capability, empty by default
    def check_config(cls, args: dict[str, Any]) -> None:
        """Refuse engine arguments that cannot work (``args``: the composed ``rollout`` node without the schedule
        keys), raising :class:`~grpolab.errors.ConfigError` naming ``rollout.<key>``. Called before any model is
        built. Default: nothing to check (the constructor still validates its arguments)."""

    @classmethod
    def memory_needs(cls, args: dict[str, Any], shape: GenerationShape) -> SamplerMemory:
        """The sampler's memory in the training process, from the engine's constructor arguments alone (read by the
        memory plan before any model is built; the plan only adds the numbers).

        Default, for an engine that declares nothing: it decodes every sequence of a refresh at once on the training
        device (:func:`~grpolab.plan.sampler_memory.decode_cache_bytes` of ``shape.train_rows``), holds a torch copy of the
        policy (``shape.policy_bytes``) when it owns its weights, and validates on an engine like itself; a note
        says so. An engine overrides it with its own arithmetic (the engines that ship do).

        Args:
            args: the ``rollout`` node without the schedule keys (``_target_`` and the constructor arguments).
            shape: what the run asks of a sampler (:class:`~grpolab.plan.sampler_memory.GenerationShape`).

        Returns:
            A :class:`~grpolab.plan.sampler_memory.SamplerMemory` (bytes per training process).
        """
        copy = shape.policy_bytes if cls.owns_weights else 0
        return SamplerMemory(
            weights_bytes=copy, cache_bytes=decode_cache_bytes(shape, shape.train_rows),
            generation_rows=shape.train_rows, eval_cache_bytes=decode_cache_bytes(shape, shape.eval_rows),
            notes=(f"{cls.__name__} declares no memory_needs: planned as a decode of every sequence of a refresh at "
                   "once on the training device" + (", with a copy of the policy" if copy else ""),))

    #: The ``_target_`` path of the class to use instead with ``rollout.async_generation=true`` (built with the same
    #: arguments), for an engine that samples on the live policy and has a variant owning a copy; None = this class.
    #: A path rather than a class, as in a config's ``_target_``, so an engine never imports its variant's module.
    async_target: ClassVar[str | None] = None

    @classmethod
    def async_engine(cls) -> type[GenerationEngine]:
        """The engine class to use with ``rollout.async_generation=true``: this class if it owns its weights or names
        no variant, else the class at :attr:`async_target`.

        Raises:
            TypeError: :attr:`async_target` is not a :class:`GenerationEngine` that owns its weights.
        """
        if cls.owns_weights or cls.async_target is None:
            return cls
        from hydra.utils import get_class

        variant = get_class(cls.async_target)
        if not (isinstance(variant, type) and issubclass(variant, GenerationEngine) and variant.owns_weights):
            raise TypeError(f"{cls.__name__}.async_target={cls.async_target!r} is not a GenerationEngine that owns "
                            "its weights")
        return variant

    # --------------------------------------------------------------------------------------- sampling
    @abstractmethod
    def generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """Sample one completion per prompt (repeat a prompt G times for a group).

        Args:
            model: the live policy (an engine that owns its weights ignores it, except to build itself).
            prompts: token ids per prompt, unpadded.
            params: the sampling settings.

        Returns:
            A :class:`Generation` on CPU, row ``i`` for prompt ``i``.
        """

    def validation_engine(self) -> GenerationEngine:
        """The engine that measures held-out accuracy on the live policy. Default: this one (an engine that samples
        in place). An engine that owns a copy (up to k - 1 steps old) must return an in-place engine, so validation
        never sees stale weights (enforced when the class is defined)."""
        return self

    def sampler_module(self) -> torch.nn.Module | None:
        """The torch module holding the sampler's weights, for a trainer forward that recomputes log alpha; None
        when the live policy holds them at refresh time (in place) or no module does (an inference engine)."""
        return None

    # ---------------------------------------------------------------------------------------- weights
    def sync_weights(self, model: Any, version: int) -> None:  # noqa: B027 - an optional capability, empty by default
        """Give the sampler the policy's current weights, ``version`` being the optimizer step they are from.

        Called once per sampler refresh. Default (an in-place engine): nothing to do, ``generate`` samples from
        the live policy, which does not change between a refresh and its sampling.

        Raises:
            RuntimeError: if the push fails; a push is never skipped silently.
        """

    def sampler_state_dict(self) -> dict[str, torch.Tensor]:
        """The sampler's weights (CPU tensors), for a checkpoint taken while a buffer is in flight."""
        raise NotImplementedError(f"{type(self).__name__} holds no weights of its own")

    def load_sampler_state_dict(self, state: dict[str, torch.Tensor], like: Any) -> None:
        """Restore :meth:`sampler_state_dict`; ``like`` (the policy) gives the architecture if the engine must be
        built first."""
        raise NotImplementedError(f"{type(self).__name__} holds no weights of its own")

    def keep_sampler_state(self) -> None:  # noqa: B027 - an optional capability, empty by default
        """From now on keep what :meth:`sampler_state_dict` needs at every push. Called once by the asynchronous
        refresh before its first push (a checkpoint may then hold a buffer in flight). Default: nothing to keep."""

    # ---------------------------------------------------------------------------------------- restarts
    def can_restart(self, err: BaseException) -> bool:
        """Whether :meth:`restart` would replace a sampler that failed with ``err`` (a server this run started,
        within its restart budget). Default: False (an in-process engine's failure stops the run)."""
        return False

    def restart_note(self, err: BaseException) -> str:
        """Why a sampler that failed with ``err`` is not restarted, naming the setting (e.g. ``not restarted
        again (rollout.server.max_restarts=1, 1 used)``), put before the failure's reason; "" = nothing to say."""
        return ""

    def restart(self, err: BaseException) -> None:
        """Replace the sampler that failed with ``err`` by a fresh one that holds no weights yet: the next
        :meth:`sync_weights` or :meth:`load_sampler_state_dict` gives it its weights (read :meth:`sampler_state_dict`
        before). Called only after :meth:`can_restart` returned True.

        Raises:
            NotImplementedError: the engine cannot restart its sampler (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot restart its sampler")

    def close(self) -> None:  # noqa: B027 - an optional capability, empty by default
        """Release what the engine started (processes, servers, memory). Called once at the end of a run."""


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into ids [B, P] and mask [B, P] (long)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask
