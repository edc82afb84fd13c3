"""The ``rollout`` group's schedule settings that are not engine constructor arguments (conf/rollout/base.yaml).

Pure and Lightning-free: :func:`split_rollout_config` separates them from the engine's arguments and
:class:`RolloutConfig` validates them before any model is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hydra.utils import get_class

from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.rollout.engines.base import GenerationEngine
from grpolab.rollout.rules.base import RefreshRule
from grpolab.rollout.schedule import Schedule


@dataclass
class RolloutConfig:
    """How rollout buffers are scheduled.

    Attributes:
        async_generation: generate buffer r+1 in a background thread, from the weights the sampler received
            at refresh r, while the trainer trains on buffer r (lag k*i .. 2*k*i-1 instead of 0 .. k*i-1, with
            k = ``algo.steps_per_generation``, i = ``algo.num_iterations``). Needs an engine that owns its
            weights.
        max_lag: the largest lag (optimizer steps between the policy version that sampled a minibatch and
            the step trained on it) allowed; null = no bound beyond the schedule's. With async generation a
            bound below 2*k*i-1 makes the sampler wait into the current buffer before taking the weights it
            generates the next buffer from
            (:meth:`~grpolab.rollout.schedule.Schedule.push_delay`). Must be >= k*i-1.
        generation_timeout_s: seconds the trainer waits for a background buffer before the run stops with
            an error naming the step (null = wait forever).
        overlap_steps: async: how many training steps of each buffer run beside the generation of the next
            one, trainer and sampler threads with half the CPU cores each. At the end of them the trainer waits
            for the next buffer (if it is not done yet) and takes every core for the rest of the buffer. A fixed
            number of steps, never a timing, decides which steps run on how many threads, so a run stays
            bitwise reproducible (kernels' results can depend on the thread count). null = half the steps of a
            buffer, rounded up (k=10: 5); >= the steps of a buffer keeps the split for the whole buffer.
        refresh: the refresh rules (:mod:`grpolab.rollout.rules`), composed: the buffer refreshes early, at a
            minibatch boundary, when any of them fires; ``algo.steps_per_generation`` stays the latest refresh. A dict
            of ``_target_`` nodes by name (what ``rollout/refresh=[steps,drift,ess]`` composes from
            ``conf/rollout/refresh/``), a list of them, or None (no rule: every k steps). The old spellings ``"steps"``
            and ``"adaptive"`` (with ``max_drift``) still work: they are the ``steps`` and ``drift`` rules.
        max_drift: the old spelling of the drift rule's bound, read with ``refresh="adaptive"`` only.
    Raises:
        ValueError: naming ``rollout.<key>``.
    """

    async_generation: bool = False
    max_lag: int | None = None
    generation_timeout_s: float | None = None
    overlap_steps: int | None = None
    refresh: Any = None
    max_drift: float | None = None

    def validate(self, algo: GRPOConfig, engine: type[GenerationEngine]) -> RolloutConfig:
        """Check the values against the algorithm and the engine's capabilities; returns self.

        Raises:
            ValueError: naming ``rollout.<key>`` (or the ``algo.<key>`` it conflicts with) and the setting to change.
        """
        if not isinstance(self.async_generation, bool):
            raise ConfigError(f"rollout.async_generation must be true or false, got {self.async_generation!r}")
        if self.async_generation and not engine.owns_weights:
            raise ConfigError(f"rollout.async_generation=true needs an engine that owns its sampler weights (the "
                              f"in-place {engine.__name__} would sample from the policy while it trains): use "
                              f"rollout=hf_copy or rollout=vllm, or set rollout.async_generation=false")
        if algo.vllm_importance_sampling_correction and not engine.reports_sampler_logp:
            raise ConfigError("algo.vllm_importance_sampling_correction=true needs an engine that reports its own "
                              f"log-probs (rollout=vllm); {engine.__name__} samples with the trainer's own forward: "
                              "set algo.vllm_importance_sampling_correction=false or use rollout=vllm")
        per_buffer = self.schedule(algo).steps_per_buffer
        if self.max_lag is not None:
            if isinstance(self.max_lag, bool) or not isinstance(self.max_lag, int) or self.max_lag < per_buffer - 1:
                raise ConfigError(f"rollout.max_lag must be null or an integer >= algo.steps_per_generation x "
                                  f"algo.num_iterations - 1 = {per_buffer - 1} (the lag within one buffer), got "
                                  f"{self.max_lag!r}")
        if self.overlap_steps is not None and (isinstance(self.overlap_steps, bool)
                                               or not isinstance(self.overlap_steps, int) or self.overlap_steps < 1):
            raise ConfigError(f"rollout.overlap_steps must be null or an integer >= 1, got {self.overlap_steps!r}")
        self.refresh_rules(algo)  # built and checked once here; the data module builds its own
        if self.generation_timeout_s is not None and not self.generation_timeout_s > 0:
            raise ConfigError(f"rollout.generation_timeout_s must be > 0 or null, got {self.generation_timeout_s!r}")
        return self

    def schedule(self, algo: GRPOConfig) -> Schedule:
        """The buffer :class:`~grpolab.rollout.schedule.Schedule` of these settings with ``algo``'s k and i."""
        return Schedule(algo.steps_per_generation, algo.num_iterations, self.max_lag, self.overlap_steps)

    def refresh_rules(self, algo: GRPOConfig) -> list[RefreshRule]:
        """The refresh rules of ``rollout.refresh``, built from their ``_target_`` nodes and checked against the
        schedule (a new list of new rules at every call).

        Raises:
            ConfigError: naming ``rollout.refresh.<name>[.<key>]`` (or the old spelling's key).
        """
        schedule = self.schedule(algo)
        rules: dict[str, str] = {}
        built = []
        for where, key_prefix, node in self._rule_nodes():
            rule = _build_rule(where, key_prefix, node, schedule)
            if rule.may_end_early(schedule) and schedule.steps_per_generation < 2:
                raise ConfigError(f"{where} ends a buffer early, so it needs algo.steps_per_generation >= 2 (the latest "
                                  f"refresh), got {schedule.steps_per_generation}")
            if rule.name in rules:
                raise ConfigError(f"{rules[rule.name]} and {where} are both the refresh rule {rule.name!r} (their "
                                  "metrics and checkpoint entries would mix): keep one")
            rules[rule.name] = where
            built.append(rule)
        return built

    def _rule_nodes(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(where, key prefix, node)`` of each rule: where names it in an error, the prefix its keys."""
        refresh = self.refresh
        if isinstance(refresh, str):
            if refresh not in OLD_SPELLINGS:
                raise ConfigError(f"rollout.refresh={refresh}: choose refresh rules with rollout/refresh=[{refresh}] (a "
                                  "slash: the config group conf/rollout/refresh/, several at once in brackets), or the "
                                  "old spellings rollout.refresh=steps or rollout.refresh=adaptive rollout.max_drift=D")
            node: dict[str, Any] = {"_target_": OLD_SPELLINGS[refresh]}
            if refresh == "adaptive":
                if (isinstance(self.max_drift, bool) or not isinstance(self.max_drift, int | float)
                        or not self.max_drift > 0):
                    raise ConfigError(f"rollout.refresh=adaptive needs rollout.max_drift, a number > 0 (e.g. 0.05), got "
                                      f"{self.max_drift!r} (new spelling: rollout/refresh=drift "
                                      "rollout.refresh.drift.max_drift=0.05)")
                return [("rollout.refresh=adaptive", "rollout.", {**node, "max_drift": self.max_drift})]
        if self.max_drift is not None:
            raise ConfigError("rollout.max_drift is read by rollout.refresh=adaptive only (the old spelling of "
                              "rollout/refresh=drift rollout.refresh.drift.max_drift=D): set rollout.refresh=adaptive, "
                              "or rollout.max_drift=null")
        if isinstance(refresh, str):
            return [(f"rollout.refresh={refresh}", "rollout.refresh.", node)]
        if refresh is None:
            return []
        if isinstance(refresh, dict):
            named = [(f"rollout.refresh.{k}", f"rollout.refresh.{k}.", v) for k, v in refresh.items() if v is not None]
        elif isinstance(refresh, list):
            named = [(f"rollout.refresh[{i}]", f"rollout.refresh[{i}].", v) for i, v in enumerate(refresh)]
        else:
            raise ConfigError(f"rollout.refresh must be refresh rules (rollout/refresh=[steps,drift]), got {refresh!r}")
        for where, _, node in named:
            if not isinstance(node, dict) or "_target_" not in node:
                raise ConfigError(f"{where} is not a rule node with a _target_, got {node!r}: choose the rules with "
                                  "rollout/refresh=[<name>,...] (conf/rollout/refresh/<name>.yaml), then set their keys")
        return named


# rollout.refresh=<old spelling> -> the rule it is now
OLD_SPELLINGS = {"steps": "grpolab.rollout.rules.steps.EveryKSteps", "adaptive": "grpolab.rollout.rules.drift.DriftRefresh"}


def plugin_class(where: str, target: Any, base: type) -> type:
    """The class a ``<where>._target_`` names, checked to be a subclass of ``base`` (an engine, a refresh rule).

    Raises:
        ConfigError: naming ``<where>._target_``: not importable (Hydra's reason), or not a ``base`` subclass.
    """
    try:
        cls = get_class(str(target))
    except Exception as err:  # Hydra raises ImportError or ValueError depending on what is missing
        raise ConfigError(f"{where}._target_={target!r} is not an importable class ({err})") from err
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{where}._target_={target!r} is not a {base.__module__}.{base.__qualname__} subclass")
    return cls


def _build_rule(where: str, key_prefix: str, node: dict[str, Any], schedule: Schedule) -> RefreshRule:
    """One rule of ``rollout.refresh``, built and checked against ``schedule``.

    Raises:
        ConfigError: the target is not a :class:`RefreshRule`, or the rule refused its arguments (its message, which
            names the key first, after ``key_prefix``).
    """
    target = node["_target_"]
    cls = plugin_class(where, target, RefreshRule)
    if not cls.name:
        raise ConfigError(f"{where}._target_={target!r} has no name: set the class attribute name (its metrics, "
                          "summary keys and checkpoint entry go by it)")
    try:
        rule = cls(**{k: v for k, v in node.items() if k != "_target_"})
    except TypeError as err:  # a key the rule does not take, or one it needs
        raise ConfigError(f"{where}: {err}") from err
    except ValueError as err:
        raise ConfigError(f"{key_prefix}{err}") from err
    try:
        rule.check(schedule)
    except ValueError as err:
        raise ConfigError(f"{key_prefix}{err}") from err
    return rule


def split_rollout_config(rollout: dict[str, Any]) -> tuple[dict[str, Any], RolloutConfig]:
    """Split the composed ``rollout`` node into (engine constructor arguments, :class:`RolloutConfig`)."""
    names = {f.name for f in fields(RolloutConfig)}
    settings = RolloutConfig(**{k: v for k, v in rollout.items() if k in names})
    return {k: v for k, v in rollout.items() if k not in names}, settings


def resolve_rollout(rollout: dict[str, Any], algo: GRPOConfig | None) -> tuple[type[GenerationEngine],
                                                                                  dict[str, Any], RolloutConfig]:
    """The engine class, its constructor arguments and the validated schedule settings of a ``rollout`` node.

    The class is the node's ``_target_`` (``conf/rollout/<name>.yaml``), or its :meth:`GenerationEngine.async_engine`
    with ``rollout.async_generation=true``. Runs before any model is built, so every error names a key.

    Args:
        rollout: the composed ``rollout`` node as a plain dict (``_target_`` + engine arguments + schedule keys).
        algo: the validated algorithm settings; None when there is no training schedule (``src/eval.py``): the
            schedule keys are then not checked against an algorithm, the engine still is.

    Raises:
        ValueError: naming ``rollout.<key>`` for an unknown engine, an engine that is not a
            :class:`GenerationEngine`, or a setting that conflicts with the algorithm or the engine.
        ImportError: the engine's dependency is missing (naming the install command).
    """
    engine_args, settings = split_rollout_config(rollout)
    target = engine_args.get("_target_")
    engine_cls = plugin_class("rollout", target, GenerationEngine)
    if settings.async_generation is True:
        engine_cls = engine_cls.async_engine()
        engine_args["_target_"] = f"{engine_cls.__module__}.{engine_cls.__qualname__}"
    if algo is not None:
        settings.validate(algo, engine_cls)
    recompute = bool(engine_args.get("recompute_sampler_logp")) or bool(algo and algo.vllm_importance_sampling_correction)
    if algo is not None and settings.async_generation and recompute and not engine_cls.samples_from_module:
        raise ConfigError(f"rollout.async_generation=true with {engine_cls.__name__} takes log alpha from the engine, "
                          "which holds the sampler's weights outside the trainer: set rollout.recompute_sampler_logp="
                          "false and algo.vllm_importance_sampling_correction=false, or rollout.async_generation=false")
    engine_cls.check_config(engine_args)
    engine_cls.check_installed()
    return engine_cls, engine_args, settings
