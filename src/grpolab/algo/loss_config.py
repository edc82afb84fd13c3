"""The loss settings of the ``algo`` config group, declared and validated once.

:class:`LossConfig` is the base of :class:`~grpolab.config.GRPOConfig`: the run's config IS a loss config, so
the loss functions take it as it is, and a pure-maths test builds a bare ``LossConfig``. The names of the
registered variants (``algo.clip_mode``, :mod:`grpolab.algo.policy_loss`) and aggregations
(``algo.loss_type``, :mod:`grpolab.algo.aggregation`) are looked up at validation time, so a variant
registered before the config is built is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import grpolab.algo.corrections  # noqa: F401  (registers the off-policy corrections as clip_mode variants)
from grpolab.algo.aggregation import get_aggregation
from grpolab.algo.kl import KL_ESTIMATORS
from grpolab.algo.policy_loss import IS_LEVELS, POLICY_LOSSES, RATIO_REFERENCES, get_policy_loss
from grpolab.errors import ConfigError


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class LossConfig:
    """Objective knobs (config group ``algo``, TRL's names where TRL has one); ``__post_init__`` validates them.

    Attributes:
        epsilon: lower clip half-width, ``> 0`` (TRL's ``epsilon``, default 0.2).
        epsilon_high: upper clip half-width ``>= 0``; ``None`` means ``epsilon`` (symmetric).
        clip_mode: a registered policy-loss variant: ``"ppo"`` (window around 1), ``"offpolicy_grpo"`` (window
            around ``pi_k / alpha``), or one added with :func:`~grpolab.algo.policy_loss.register_policy_loss`.
        importance_sampling_level: ``"token"``, ``"sequence"`` (GSPO: ``exp`` of the MEAN token log-ratio)
            or ``"sequence_sum"`` (the paper's ``pi(y|x)/alpha(y|x)``: ``exp`` of the SUM).
        beta: weight ``>= 0`` of the KL to the reference; 0 means no reference is needed.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        loss_type: a registered aggregation: ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"``
            (:mod:`grpolab.algo.aggregation`).
        max_completion_length: the constant ``L_max`` of ``dr_grpo`` (required for it), ``> 0``.
        ratio_reference: ``"sampler"`` (``pi / alpha``, window from ``clip_mode``), ``"anchor"``
            (``pi / pi_k``, window ``[1 - eps, 1 + eps_high]``) or ``"previous"`` (``pi / pi_{t-1}``, the policy
            before the last optimizer step; needs ``clip_mode="ppo"``: the window ``[1 - eps, 1 + eps_high]``).
        importance_weight_cap: ``None`` or a finite ``c >= 1``: caps the centre ``pi_k / alpha`` (and scales the
            ratio alike) to ``c``; only for the variants that list it (``offpolicy_grpo``, with
            ``ratio_reference="sampler"``).
        behaviour_weight_cap: ``None`` or a finite number ``> 1``: ``clip_mode=decoupled_ppo`` drops tokens whose
            behaviour weight ``pi_prox / alpha`` exceeds it (AReaL's ``behav_imp_weight_cap``).
        proximal_policy: ``None`` (= ``"anchor"``: ``pi_k``) or ``"loglinear"`` (AReaL's approximation), for
            ``clip_mode=decoupled_ppo``.
        is_mask_low: ``None`` or a number in ``[0, 1]``: lower end of the band of ``geo_seq_mask`` and
            ``token_is_mask`` (null = the variant's published default, :mod:`grpolab.algo.corrections`).
        is_mask_high: ``None`` or a number ``>= 1``: upper end of the band of ``seq_is_mask``, ``geo_seq_mask``
            and ``token_is_mask`` (null = the variant's default).

        variant_options: the values of keys that a variant registered outside this class declares in its
            ``options`` (``register_policy_loss(name, options=("my_scale",))``), set as ``+algo.my_scale=0.5`` and
            read as ``cfg.my_scale``; a key no variant declares is refused by :meth:`GRPOConfig.from_dict`.

    Raises:
        ValueError: naming ``algo.<field>`` for any invalid value; an unknown ``clip_mode`` or ``loss_type``
            lists the registered names.
    """

    epsilon: float = 0.2
    epsilon_high: float | None = None
    clip_mode: str = "ppo"
    importance_sampling_level: str = "token"
    beta: float = 0.0
    kl_estimator: str = "k3"
    loss_type: str = "bnpo"
    max_completion_length: int | None = None
    ratio_reference: str = "sampler"
    importance_weight_cap: float | None = None
    behaviour_weight_cap: float | None = None
    proximal_policy: str | None = None
    is_mask_low: float | None = None
    is_mask_high: float | None = None
    variant_options: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """``cfg.<key>`` for a key a registered variant declares in its ``options`` and that is not a field: its
        value from ``variant_options`` (``+algo.<key>=...``), else None. Called only for names that are not
        attributes."""
        options = self.__dict__.get("variant_options")
        if options is not None and name in options:
            return options[name]
        if any(name in v.options for v in POLICY_LOSSES.values()):
            return None
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __post_init__(self) -> None:
        if not (_is_number(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"algo.epsilon must be a finite number > 0, got {self.epsilon!r}")
        if self.epsilon_high is not None and not (_is_number(self.epsilon_high) and self.epsilon_high >= 0):
            raise ConfigError(
                f"algo.epsilon_high must be null or a finite number >= 0, got {self.epsilon_high!r}"
            )
        variant = get_policy_loss(self.clip_mode)
        if self.importance_sampling_level not in IS_LEVELS:
            raise ConfigError(
                f"algo.importance_sampling_level must be one of {IS_LEVELS}, got {self.importance_sampling_level!r}"
            )
        if self.ratio_reference not in RATIO_REFERENCES:
            raise ConfigError(f"algo.ratio_reference must be one of {RATIO_REFERENCES}, got {self.ratio_reference!r}")
        if self.ratio_reference == "previous" and self.clip_mode != "ppo":
            raise ConfigError("algo.ratio_reference=previous (ratio pi/pi_{t-1}) takes the PPO window: it needs "
                              f"algo.clip_mode=ppo, got algo.clip_mode={self.clip_mode!r}")
        if not (_is_number(self.beta) and self.beta >= 0):
            raise ConfigError(f"algo.beta must be a finite number >= 0, got {self.beta!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError(f"algo.kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        aggregation = get_aggregation(self.loss_type)
        mcl = self.max_completion_length
        if mcl is not None and not (isinstance(mcl, int) and not isinstance(mcl, bool) and mcl > 0):
            raise ConfigError(f"algo.max_completion_length must be null or an int > 0, got {mcl!r}")
        for key in aggregation.requires:
            if getattr(self, key) is None:
                raise ConfigError(f"algo.{key} must be set when algo.loss_type is {self.loss_type!r}: set algo.{key}=<value> "
                                  "or choose another algo.loss_type")
        cap = self.importance_weight_cap
        if cap is not None and not (_is_number(cap) and cap >= 1):
            raise ConfigError(f"algo.importance_weight_cap must be null or a finite number >= 1, got {cap!r}")
        bcap = self.behaviour_weight_cap
        if bcap is not None and not (_is_number(bcap) and bcap > 1):
            raise ConfigError(f"algo.behaviour_weight_cap must be null or a finite number > 1, got {bcap!r}")
        for key in ("is_mask_low", "is_mask_high"):
            value = getattr(self, key)
            if value is not None and not (_is_number(value) and value >= 0):
                raise ConfigError(f"algo.{key} must be null or a finite number >= 0, got {value!r}")
        self._check_variant_options()
        if variant.check is not None:
            variant.check(self)

    def _check_variant_options(self) -> None:
        """A key that only some variants read (their ``options``) must be null for the others."""
        options = dict.fromkeys(o for v in POLICY_LOSSES.values() for o in v.options)
        for key in options:
            if getattr(self, key, None) is None or key in POLICY_LOSSES[self.clip_mode].options:
                continue
            readers = "|".join(v.name for v in POLICY_LOSSES.values() if key in v.options)
            raise ConfigError(f"algo.{key} is read by algo.clip_mode={readers} only; got algo.clip_mode="
                              f"{self.clip_mode!r}: set algo.{key}=null or algo.clip_mode={readers}")

    @property
    def eps_high(self) -> float:
        """The upper clip half-width actually used (``epsilon_high`` or, if null, ``epsilon``)."""
        return self.epsilon if self.epsilon_high is None else float(self.epsilon_high)
