"""A Hugging Face sampler that owns its weights: a copy of the policy refreshed only by ``sync_weights``.

This is the CPU/GPU stand-in for a separate inference engine (vLLM, a sampler server): the sampler alpha is
a distinct module that changes only at a sampler refresh, every ``steps_per_generation`` optimizer steps, as
in the paper's off-policy setting where the sampler receives the policy's weights every v steps. It is what lets
generation run in a background thread while the trainer updates the live policy (``rollout.async_generation``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams
from grpolab.rollout.engines.hf import HFGenerationEngine


class HFSamplerCopyEngine(HFGenerationEngine):
    """``generate`` on a private copy of the policy; ``sync_weights`` loads the policy's weights into it.

    The copy is made with ``copy.deepcopy`` at the first ``sync_weights`` (so it has the policy's class,
    config, dtype and device), kept in eval mode without gradients, and afterwards refreshed in place with
    ``load_state_dict`` (a tied ``lm_head`` stays tied: it is one tensor in the copy too). ``generate``
    ignores the live model it is passed.

    Args:
        stop_token_ids, pad_token_id, generation_batch_size, drop_finished_rows, cache_implementation: as
            :class:`HFGenerationEngine`.
        recompute_sampler_logp: False (default here, as a separate inference engine would): log alpha is the
            log-probs recorded while sampling (no forward over the buffer); True: a forward on the sampler's
            copy in the training pass's shapes (as :class:`HFGenerationEngine` does by default).

    Raises:
        RuntimeError: from ``generate`` or ``sampler_state_dict`` before the first ``sync_weights``.
    """

    owns_weights = True
    supports_sharded_policy = False  # a deep copy of an FSDP-sharded policy would hold shards, not a model

    def __init__(self, stop_token_ids: list[int], pad_token_id: int, generation_batch_size: int | None = None,
                 drop_finished_rows: bool = True, recompute_sampler_logp: bool = False,
                 cache_implementation: str = "dynamic"):
        super().__init__(stop_token_ids, pad_token_id, generation_batch_size, drop_finished_rows,
                         recompute_sampler_logp, cache_implementation)
        self.sampler_model: torch.nn.Module | None = None

    @classmethod
    def memory_needs(cls, args: dict[str, Any], shape: GenerationShape) -> SamplerMemory:
        """:meth:`HFGenerationEngine.memory_needs` plus the copy, ``shape.policy_bytes`` (a ``deepcopy`` of the
        policy: its dtype, LoRA adapters included), held for the whole run."""
        in_place = super().memory_needs(args, shape)
        knob = () if shape.async_generation else ("rollout=hf (samples in place, no copy)",)
        return dataclasses.replace(in_place, weights_bytes=shape.policy_bytes, knobs=knob, notes=())

    def sync_weights(self, model: Any, version: int) -> None:
        """Copy the policy's current weights (from optimizer step ``version``) into the sampler (deep copy the
        first time)."""
        if self.sampler_model is None:
            self.sampler_model = copy.deepcopy(model)
            self.sampler_model.eval().requires_grad_(False)
            return
        with torch.no_grad():
            self.sampler_model.load_state_dict(model.state_dict())

    def generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """Sample from the sampler's copy (``model`` is ignored); see :meth:`HFGenerationEngine.generate`."""
        return super().generate(self._sampler(), prompts, params)

    def sampler_module(self) -> torch.nn.Module | None:
        """The sampler's copy (None before the first :meth:`sync_weights`)."""
        return self.sampler_model

    def validation_engine(self) -> GenerationEngine:
        """An in-place engine with the same settings: held-out accuracy is measured on the live policy."""
        return HFGenerationEngine(self.stop_token_ids, self.pad_token_id, self.generation_batch_size,
                                  self.drop_finished_rows, cache_implementation=self.cache_implementation)

    def sampler_state_dict(self) -> dict[str, torch.Tensor]:
        """The sampler's weights (CPU clones), for a checkpoint of a run whose next buffer is in flight."""
        return {k: v.detach().cpu().clone() for k, v in self._sampler().state_dict().items()}

    def load_sampler_state_dict(self, state: dict[str, torch.Tensor], like: Any) -> None:
        """Restore the sampler from :meth:`sampler_state_dict`; ``like`` (the policy) gives the architecture."""
        if self.sampler_model is None:
            self.sampler_model = copy.deepcopy(like)
            self.sampler_model.eval().requires_grad_(False)
        with torch.no_grad():
            self.sampler_model.load_state_dict(state)

    def _sampler(self) -> torch.nn.Module:
        if self.sampler_model is None:
            raise RuntimeError("HFSamplerCopyEngine: sync_weights(policy) must be called before sampling")
        return self.sampler_model
