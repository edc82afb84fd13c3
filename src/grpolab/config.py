"""Typed, validated algorithm settings (the ``algo`` config group without the optimizer partials).

Field names follow TRL's ``GRPOConfig`` where TRL has one. Every check raises a ``ValueError`` naming the
``algo.<key>`` at fault, before any model is built. The loss settings (``epsilon``, ``clip_mode``, ``loss_type``,
...) are inherited from :class:`~grpolab.algo.loss_config.LossConfig`, which declares and validates them.
"""

from __future__ import annotations

import difflib
import logging
import math
import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from grpolab.algo.loss_config import LossConfig
from grpolab.algo.policy_loss import POLICY_LOSSES
from grpolab.config_checks import simple_types, type_error
from grpolab.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class GRPOConfig(LossConfig):
    """GRPO knobs: the loss settings of :class:`~grpolab.algo.loss_config.LossConfig` plus sampling, batching,
    masking and optimisation. See ``conf/algo/base.yaml`` for one comment per value.

    The paper's ``v`` (sampler refresh period) is ``steps_per_generation``; its ``i`` (gradient steps per
    sampled minibatch) is ``num_iterations``. Being a ``LossConfig``, an instance is passed as it is to
    :func:`~grpolab.algo.losses.grpo_loss`.

    Raises:
        ValueError: naming ``algo.<key>`` for any invalid value (types first, then ranges, then the loss
            settings).
    """

    # Written to summary.json beside ``algo`` (the name) and every LossConfig field, by :meth:`summary`.
    SUMMARY_KEYS: ClassVar[tuple[str, ...]] = ("steps_per_generation", "num_iterations", "mask_zero_std_groups",
                                               "learning_rate", "skip_zero_grad_steps")

    name: str = "grpo_onpolicy"
    num_generations: int = 8
    per_device_train_batch_size: int = 64
    micro_batch_size: int | None = None
    steps_per_generation: int = 1
    num_iterations: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    max_completion_length: int = 8  # also a LossConfig field (dr_grpo's L_max); here a generation limit, never null
    scale_rewards: str = "group"
    advantage_epsilon: float = 1e-4
    mask_zero_std_groups: bool = False
    mask_truncated_completions: bool = False
    truncated_reward: float | None = 0.0
    ref_refresh_every: int | None = None
    lower_bound_every: int | None = 10
    zero_std_threshold: float = 0.0
    learning_rate: float = 1e-4
    max_grad_norm: float | None = 1.0
    skip_zero_grad_steps: bool = False
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_cap: float = 3.0
    shared_prompt_forward: bool = True

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):  # types first (algo.temperature=abc, =inf), so the checks below can compare
            allowed = simple_types(hints[f.name])
            msg = type_error(f"algo.{f.name}", getattr(self, f.name), allowed) if allowed else None
            if msg:
                raise ConfigError(msg)

        def need(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"algo.{key} {what}, got {getattr(self, key)!r}")

        need(self.num_generations >= 2, "num_generations", "must be >= 2 (a group of one has no baseline)")
        need(self.per_device_train_batch_size >= self.num_generations
             and self.per_device_train_batch_size % self.num_generations == 0,
             "per_device_train_batch_size", f"must be a positive multiple of algo.num_generations={self.num_generations}")
        if self.micro_batch_size is not None:
            need(self.micro_batch_size >= 1, "micro_batch_size", "must be >= 1 or null")
        need(self.steps_per_generation >= 1, "steps_per_generation", "must be >= 1")
        need(self.num_iterations >= 1, "num_iterations", "must be >= 1")
        need(self.temperature > 0, "temperature", "must be > 0")
        # The trainer's log-probs use the temperature transform only, so the sampler must not truncate the
        # distribution, or the first on-policy ratio would not be 1 (docs/guide/pitfalls.md #13).
        need(self.top_p == 1.0, "top_p", "must be 1.0 for training (truncated sampling biases the ratio)")
        need(self.top_k in (0, None), "top_k", "must be 0 (disabled) for training (truncated sampling biases the ratio)")
        need(self.max_completion_length >= 1, "max_completion_length", "must be >= 1")
        if self.max_prompt_length is not None:
            need(self.max_prompt_length >= 1, "max_prompt_length", "must be >= 1 or null")
        need(self.scale_rewards in ("group", "batch", "none"), "scale_rewards", "must be group|batch|none")
        need(self.advantage_epsilon >= 0, "advantage_epsilon", "must be >= 0")
        if self.truncated_reward is not None:
            need(math.isfinite(self.truncated_reward), "truncated_reward", "must be a finite number or null")
        need(self.learning_rate > 0, "learning_rate", "must be > 0")
        if self.max_grad_norm is not None:
            need(self.max_grad_norm > 0, "max_grad_norm", "must be > 0 or null")
        if self.ref_refresh_every is not None:
            need(self.ref_refresh_every >= 1, "ref_refresh_every", "must be >= 1 or null")
        if self.lower_bound_every is not None:
            need(isinstance(self.lower_bound_every, int) and not isinstance(self.lower_bound_every, bool)
                 and self.lower_bound_every >= 0, "lower_bound_every", "must be an int >= 0 or null (0/null = never)")
        need(isinstance(self.zero_std_threshold, int | float) and not isinstance(self.zero_std_threshold, bool)
             and math.isfinite(self.zero_std_threshold) and self.zero_std_threshold >= 0,
             "zero_std_threshold", "must be a finite number >= 0 (0 = all rewards exactly equal)")
        need(isinstance(self.vllm_importance_sampling_correction, bool), "vllm_importance_sampling_correction",
             "must be true or false")
        need(isinstance(self.vllm_importance_sampling_cap, int | float) and not isinstance(self.vllm_importance_sampling_cap, bool)
             and math.isfinite(self.vllm_importance_sampling_cap) and self.vllm_importance_sampling_cap >= 1.0,
             "vllm_importance_sampling_cap", "must be a finite number >= 1 (TRL default 3.0)")
        need(isinstance(self.shared_prompt_forward, bool), "shared_prompt_forward", "must be true or false")
        super().__post_init__()  # the loss settings: epsilon, clip_mode, loss_type, importance_weight_cap, ...
        if self.kl_estimator == "k1" and self.beta > 0:
            log.warning("algo.kl_estimator=k1 with algo.beta=%s: as a loss term k1 = logp - ref_logp has zero "
                        "expected gradient (its gradient is the score function), so the KL penalty does not pull "
                        "the policy towards the reference; use k3 (gradient of KL(ref||pi), TRL's default) or k2 "
                        "(gradient of KL(pi||ref))", self.beta)

    @property
    def prompts_per_step(self) -> int:
        """Distinct prompts per optimizer step (groups per minibatch)."""
        return self.per_device_train_batch_size // self.num_generations

    @property
    def reuses_samples(self) -> bool:
        """True when a minibatch is not trained on exactly once at lag 0, so sampler log-probs are needed."""
        return self.steps_per_generation > 1 or self.num_iterations > 1

    def summary(self) -> dict[str, Any]:
        """The settings written to ``summary.json``: ``algo`` (the name), :attr:`SUMMARY_KEYS`, then every
        :class:`~grpolab.algo.loss_config.LossConfig` field."""
        loss_keys = [f.name for f in fields(LossConfig)]
        return {"algo": self.name, **{k: getattr(self, k) for k in (*self.SUMMARY_KEYS, *loss_keys)}}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        """Build from a plain dict, ignoring the optimizer/scheduler partials; unknown keys raise, except the keys a
        registered variant declares in its ``options`` (kept in ``variant_options``)."""
        known = {f.name for f in fields(cls)} - {"variant_options"}
        skip = {"optimizer", "lr_scheduler"}
        declared = {o for v in POLICY_LOSSES.values() for o in v.options} - known  # a variant's own knobs
        unknown = sorted(set(values) - known - skip - declared)
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, sorted(known), n=2)
                hints.append(f"algo.{key} (did you mean {' or '.join(f'algo.{c}' for c in close)}?)" if close
                             else f"algo.{key}")
            raise ConfigError(f"algo: unknown key(s) {', '.join(hints)}; correct or remove them (known keys: "
                              f"{', '.join(sorted(known))})")
        return cls(**{k: v for k, v in values.items() if k in known},
                   variant_options={k: v for k, v in values.items() if k in declared})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
