"""Refresh rules: when the sampler takes new weights before its buffer of k minibatches runs out.

The buffer holds ``k = algo.steps_per_generation`` minibatches, so k (times ``algo.num_iterations``) optimizer steps
is the latest refresh. Before every step, each rule of the run reads one :class:`RefreshRecord` (the step, the
buffer's position and schedule, the drift and the served minibatch's log-ratios and rewards that the module measured,
a reduce over ranks) and answers whether the sampler should refresh now. :class:`RefreshRules` composes them: the
buffer ends when any rule fires, at a minibatch boundary (only there may a buffer end: a minibatch's
``num_iterations`` uses are never split), and the coming step trains on a new buffer (with
``rollout.async_generation``: the buffer in flight, and the sampler takes the current weights for the next one).

A rule owns its metrics (``train/rollout/...``, each with its cross-rank reduction declared in ``metric_rules``, as
the metrics of :mod:`grpolab.algo.metric_reduction` are), its ``summary.json`` entries and its checkpoint state. A
new rule is one file with a :class:`RefreshRule` subclass and one ``conf/rollout/refresh/<name>.yaml``
(docs/guide/schedule.md, "Refresh rules"); the data module loops over the rules and names none of them.

Every rule reads every step and takes its decision from numbers logged at the step before, never from timing, so a run
is bitwise reproducible and resumes exactly (each rule's state is in the checkpoint, and the module checkpoints what
it measured).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from grpolab.algo.metric_reduction import Rule, declare
from grpolab.handle import PolicyHandle, ServedBatch
from grpolab.rollout.buffer import RolloutBuffer
from grpolab.rollout.schedule import Schedule

Reduce = Callable[..., dict[str, float]]
"""``reduce(values, op="sum")``: a dict of floats combined over the data-parallel ranks (``op``: sum, max or min)."""


def one_process(values: dict[str, float], op: str = "sum") -> dict[str, float]:
    """The :data:`Reduce` of a single process: the values themselves."""
    return {k: float(v) for k, v in values.items()}


@dataclass(frozen=True)
class RefreshRecord:
    """What a rule may read at a step boundary, before the step's minibatch is served.

    Attributes:
        step: the coming optimizer step (steps taken before it).
        position: steps of the current buffer served so far (0 .. S, S = k x i); 0 before the first buffer.
        schedule: the buffer's k x i :class:`~grpolab.rollout.schedule.Schedule`.
        at_minibatch_boundary: steps of this buffer remain and the next is a minibatch's first use: the buffer may end
            here (a rule that fires elsewhere is not followed).
        drift: this rank's policy/sampler drift of the last minibatch trained at its first use, ``(sum, tokens)`` of
            ``0.5 |pi / alpha - 1|`` over its completion tokens (:attr:`~grpolab.handle.PolicyHandle.drift`); None
            before any.
        served: this rank's log-ratios ``log pi - log alpha`` [B, T], completion mask and rewards [B] of that
            minibatch (:class:`~grpolab.handle.ServedBatch`); None before any.
        reduce: combines a dict of floats over the data-parallel ranks (:data:`Reduce`; the values themselves in one
            process). A collective: a rule calls it under conditions that are alike on every rank (the config, the
            step, the position), so that every rank makes the same calls.
    """

    step: int
    position: int
    schedule: Schedule
    at_minibatch_boundary: bool
    drift: tuple[float, int] | float | None = None
    served: ServedBatch | None = None
    reduce: Reduce = field(default=one_process, repr=False)


class RefreshRule:
    """One refresh rule. Subclass it, set :attr:`name` and implement :meth:`should_refresh`.

    Class attributes:
        name: the rule's name (lowercase, ``_``): its metrics are ``train/rollout/<name>_refreshes`` and its own, its
            ``summary.json`` keys ``<name>_refreshes`` and ``<name>_refresh_steps``, its checkpoint entry
            ``refresh_rules.<name>``. One rule of a name per run.
        metric_rules: how each metric :meth:`metrics` adds combines over ranks, by name without ``train/``
            (:class:`~grpolab.algo.metric_reduction.Rule`; a value every rank read alike after ``record.reduce``:
            ``Rule("max")``). Declared when the class is defined.

    The constructor takes the yaml's keys (``conf/rollout/refresh/<name>.yaml``, ``_target_`` aside) and raises
    ``ValueError`` naming the key first (``"max_drift must be a number > 0, got -1"``): the run prefixes
    ``rollout.refresh.<name>.`` and stops before any model is built. State kept across steps goes in
    :meth:`state_dict` as plain numbers, strings, lists and dicts.
    """

    name: ClassVar[str] = ""
    metric_rules: ClassVar[Mapping[str, Rule]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name:
            return  # a base of other rules, which name themselves (a run refuses a rule without a name)
        if not re.fullmatch(r"[a-z][a-z0-9_]*", cls.name):
            raise TypeError(f"{cls.__name__}.name must be a lowercase name (letters, digits, _), got {cls.name!r}")
        declare({f"train/rollout/{cls.name}_refreshes": Rule("max"),
                 **{f"train/{metric}": rule for metric, rule in cls.metric_rules.items()}})

    @property
    def refresh_steps(self) -> list[int]:
        """The steps (steps taken before them) at which this rule fired and the buffer ended."""
        return self.__dict__.setdefault("_refresh_steps", [])

    def check(self, schedule: Schedule) -> None:
        """Refuse settings that cannot work with ``schedule`` (raise ``ValueError`` naming the key first). Default:
        nothing to check."""

    def may_end_early(self, schedule: Schedule) -> bool:
        """Whether this rule can end a buffer before its k x i steps (such a rule needs ``k >= 2``). Default: True."""
        return True

    def should_refresh(self, record: RefreshRecord) -> bool:
        """Whether the sampler should refresh before ``record.step``. Called before every step, on every rank."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """The step's metrics, without ``train/`` (each named in :attr:`metric_rules` or the refresh count):
        ``rollout/<name>_refreshes`` (so far) by default."""
        return {f"rollout/{self.name}_refreshes": float(len(self.refresh_steps))}

    def summary(self) -> dict[str, Any]:
        """``summary.json`` entries: ``<name>_refreshes`` (count) and ``<name>_refresh_steps`` by default."""
        return {f"{self.name}_refreshes": len(self.refresh_steps), f"{self.name}_refresh_steps": list(self.refresh_steps)}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs (plain values): ``steps`` by default."""
        return {"steps": list(self.refresh_steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.refresh_steps[:] = [int(s) for s in state.get("steps", [])]

    def load_old_layout(self, rollout_state: dict[str, Any]) -> None:
        """Restore from a data module state written before the rules were a list (no ``refresh_rules`` in it).
        Default: nothing (the rule did not exist)."""


class RefreshRules:
    """The refresh rules of a run, composed: the buffer ends early when any of them fires.

    Args:
        rules: the rules, in the config's order (unique names; built and checked by
            :meth:`~grpolab.rollout.settings.RolloutConfig.refresh_rules`).
        schedule: the buffer's schedule.

    Attributes:
        unused_minibatches: minibatches the early refreshes left untrained (their prompts are not reused).
    """

    def __init__(self, rules: Sequence[RefreshRule], schedule: Schedule) -> None:
        self.rules = list(rules)
        self.schedule = schedule
        self.unused_minibatches = 0

    def before_step(self, step: int, buffer: RolloutBuffer, models: PolicyHandle, reduce: Reduce | None = None) -> None:
        """Ask every rule about the coming ``step``; end ``buffer`` at this minibatch boundary when any fires.

        Args:
            step: the coming optimizer step.
            buffer: the buffer being served.
            models: the handle the module writes what it measured to (``drift``, ``served``).
            reduce: combines floats over ranks (:data:`Reduce`); None in one process.
        """
        record = RefreshRecord(step, buffer.position, buffer.schedule, buffer.at_minibatch_boundary(), models.drift,
                               models.served, reduce or one_process)
        fired = [rule for rule in self.rules if rule.should_refresh(record)]  # every rule reads every step
        if fired and record.at_minibatch_boundary:
            self.unused_minibatches += buffer.end_early()
            for rule in fired:
                rule.refresh_steps.append(step)

    def metrics(self) -> dict[str, float]:
        """Every rule's metrics for the coming step (without ``train/``)."""
        return {k: v for rule in self.rules for k, v in rule.metrics().items()}

    def summary(self) -> dict[str, Any]:
        """``refresh`` (``"adaptive"`` when a rule may end a buffer early, else ``"steps"``), ``refresh_rules`` (the
        names), ``unused_minibatches`` and every rule's own entries."""
        early = any(rule.may_end_early(self.schedule) for rule in self.rules)
        out: dict[str, Any] = {"refresh": "adaptive" if early else "steps",
                               "refresh_rules": [rule.name for rule in self.rules],
                               "unused_minibatches": self.unused_minibatches}
        for rule in self.rules:
            out.update(rule.summary())
        return out

    def state_dict(self) -> dict[str, Any]:
        """``refresh_rules`` (each rule's state by name) and ``unused_minibatches``."""
        return {"refresh_rules": {rule.name: rule.state_dict() for rule in self.rules},
                "unused_minibatches": self.unused_minibatches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from the data module's saved state. A rule the checkpoint does not hold starts afresh; a saved rule
        the run no longer has is left out. A state written before the rules were a list kept the early-refresh counts
        of its one rule under ``drift_refresh`` (:meth:`RefreshRule.load_old_layout`)."""
        saved = state.get("refresh_rules")
        if saved is None:
            self.unused_minibatches = int((state.get("drift_refresh") or {}).get("unused_minibatches", 0))
            for rule in self.rules:
                rule.load_old_layout(state)
            return
        self.unused_minibatches = int(state.get("unused_minibatches", 0))
        for rule in self.rules:
            rule.load_state_dict(saved.get(rule.name) or {})

