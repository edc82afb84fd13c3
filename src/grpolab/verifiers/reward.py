"""The verifier: named reward functions, weights, time limits and counting of what could not be scored.

A reward function is any callable with TRL's signature,
``func(completions: list[str], **columns) -> list[float | None]``, where the gold answer is the ``answer``
column. ``None`` means *unscorable* (e.g. a gold answer the verifier cannot parse); it is never treated
as correct (docs/guide/pitfalls.md #12): a row with ``None`` from any function of nonzero weight gets reward
``None`` and is counted, so the caller can leave it out of accuracy and of its group's baseline
(docs/guide/pitfalls.md #11).

Example (plain Python, no Hydra):

    >>> from grpolab.verifiers.gsm8k import GSM8KVerifier
    >>> rm = Verifier({"gsm8k": GSM8KVerifier()}, timeout_s=None)
    >>> rm(["#### 18", "#### 7"], answer=["18", "18"]).rewards
    [1.0, 0.0]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpolab.verifiers.process_pool import ProcessPool
from grpolab.verifiers.timeout import (
    BATCH_TIMEOUT,
    CRASHED,
    ERROR,
    OK,
    TIMEOUT,
    CallResult,
    run_in_thread,
)

log = logging.getLogger(__name__)

TRUNCATED_POLICIES = ("score", "zero", "unscorable")


@dataclass
class RewardOutput:
    """Rewards of one batch.

    Attributes:
        rewards: the weighted sum per completion; ``None`` where a function with nonzero weight returned
            ``None`` (unscorable, timed out, or its worker died), or per ``on_truncated="unscorable"``.
        per_func: each function's own values, by name (before the truncation policy).
        num_unscorable: number of completions whose reward is ``None``.
        num_timeouts: number of (function, completion) calls cut by the per-call time limit.
        num_crashed: number of calls lost because their worker process died (e.g. out of memory).
        num_batch_timeouts: number of (function, completion) calls cut or never started because the
            batch's time limit (``batch_timeout_s``) ran out.
    """

    rewards: list[float | None]
    per_func: dict[str, list[float | None]] = field(default_factory=dict)
    num_unscorable: int = 0
    num_timeouts: int = 0
    num_crashed: int = 0
    num_batch_timeouts: int = 0

    def metrics(self) -> dict[str, float]:
        """Scalars to log: ``rewards/<name>/mean`` (over scorable values; NaN if none), and counts."""
        out: dict[str, float] = {}
        for name, values in self.per_func.items():
            vals = [v for v in values if v is not None]
            out[f"rewards/{name}/mean"] = sum(vals) / len(vals) if vals else math.nan
        out["rewards/num_unscorable"] = float(self.num_unscorable)
        out["rewards/num_timeouts"] = float(self.num_timeouts)
        out["rewards/num_batch_timeouts"] = float(self.num_batch_timeouts)
        return out


class Verifier:
    """Several reward functions combined with weights, each call run under a time limit.

    Instantiable from Hydra (``conf/verifier/*.yaml``): ``reward_funcs`` maps names to instantiated
    verifiers.

    Args:
        reward_funcs: reward functions by name (the name is used in ``rewards/<name>/mean``).
        reward_weights: weight per function name; ``None`` gives every function weight 1.0. When given,
            it must name exactly the functions in ``reward_funcs``.
        timeout_s: time limit per (function, completion) call in seconds; ``None`` disables it (and, with
            ``batch_timeout_s`` also ``None``, scores each function over the whole batch in one call, the
            fastest path).
        batch_timeout_s: time limit for scoring one whole batch (one call of this object), in seconds;
            ``None`` disables it. Without it, N adversarial completions cost up to N x ``timeout_s``.
            When it runs out, the call in progress is cut and the calls not yet run are skipped: those
            completions score ``None`` and are counted (``num_batch_timeouts``); the others keep their
            scores. Calls go completion by completion (all functions of completion 0, then 1, ...), so
            a cut leaves whole completions scored. With worker processes the limit includes their
            start-up (about 2 s each, on the first call).
        num_workers: 0 scores in this process (time limit by a watchdog thread: it cannot interrupt a
            hang inside a single C call); >= 1 scores in that many worker processes, where any hang is
            cut by killing the worker. See :mod:`grpolab.verifiers.timeout` for the costs.
        on_truncated: what a completion that hit the length limit without a stop token gets, when the
            ``truncated`` column is passed (docs/guide/pitfalls.md #14): ``"score"`` (judged by its text like any
            other), ``"zero"`` (reward 0.0: an unfinished answer is no answer) or ``"unscorable"``
            (reward ``None``, left out like an unparseable gold).

    Raises:
        ValueError: on an empty ``reward_funcs``, a non-callable function, weights that do not name
            exactly the functions, a negative ``num_workers``, a non-positive ``timeout_s`` or
            ``batch_timeout_s``, or an unknown ``on_truncated``.
        TypeError: if ``num_workers >= 1`` and a function cannot be pickled (a lambda, a local class).
    """

    def __init__(
        self,
        reward_funcs: Mapping[str, Callable],
        reward_weights: Mapping[str, float] | None = None,
        timeout_s: float | None = 10.0,
        num_workers: int = 0,
        on_truncated: str = "score",
        batch_timeout_s: float | None = None,
    ) -> None:
        funcs = dict(reward_funcs or {})
        if not funcs:
            raise ValueError("verifier.reward_funcs is empty: give at least one reward function")
        for name, func in funcs.items():
            if not callable(func):
                raise ValueError(f"verifier.reward_funcs.{name} is not callable: {func!r}")
        if reward_weights is None:
            weights = {name: 1.0 for name in funcs}
        else:
            weights = {str(k): float(v) for k, v in dict(reward_weights).items()}
            unknown, missing = sorted(set(weights) - set(funcs)), sorted(set(funcs) - set(weights))
            if unknown or missing:
                raise ValueError(
                    f"verifier.reward_weights must name exactly the reward functions {sorted(funcs)}; "
                    f"unknown: {unknown}, missing: {missing}"
                )
        if num_workers < 0:
            raise ValueError(f"verifier.num_workers must be >= 0, got {num_workers}")
        for key, value in (("timeout_s", timeout_s), ("batch_timeout_s", batch_timeout_s)):
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and math.isfinite(value) and value > 0):
                raise ValueError(f"verifier.{key} must be a number > 0 or null, got {value!r}")
        if on_truncated not in TRUNCATED_POLICIES:
            raise ValueError(
                f"verifier.on_truncated must be one of {TRUNCATED_POLICIES}, got {on_truncated!r}"
            )
        self.reward_funcs = funcs
        self.reward_weights = weights
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
        self.num_workers = num_workers
        self.on_truncated = on_truncated
        # Checks picklability now (a clear error before training); processes start on the first call.
        self._pool = ProcessPool(funcs, num_workers, timeout_s) if num_workers > 0 else None

    @property
    def names(self) -> list[str]:
        """The reward function names, in order."""
        return list(self.reward_funcs)

    # --------------------------------------------------------------------------------------- scoring
    def __call__(self, completions: Sequence[str], **columns: Sequence[Any]) -> RewardOutput:
        """Score a batch.

        Args:
            completions: decoded completions.
            **columns: per-completion columns, each a list aligned with ``completions``; the gold is
                ``answer``; ``truncated`` (bools) drives ``on_truncated``. All are passed to every
                function, which ignores what it does not use.

        Returns:
            A :class:`RewardOutput`.

        Raises:
            ValueError: if a column's length differs from the number of completions, or a function returns
                the wrong number of values.
            RuntimeError: if a reward function raises (the message names it and the completion index).
        """
        completions = list(completions)
        n = len(completions)
        columns = {k: list(v) for k, v in columns.items()}
        for key, values in columns.items():
            if len(values) != n:
                raise ValueError(f"reward column {key!r} has {len(values)} values for {n} completions")
        per_func, counts = self._score(completions, columns)

        truncated = columns.get("truncated")
        rewards: list[float | None] = []
        for i in range(n):
            if truncated is not None and truncated[i] and self.on_truncated != "score":
                rewards.append(0.0 if self.on_truncated == "zero" else None)
                continue
            total: float | None = 0.0
            for name, weight in self.reward_weights.items():
                if weight == 0:
                    continue
                value = per_func[name][i]
                if value is None:
                    total = None
                    break
                total += weight * float(value)
            rewards.append(total)
        return RewardOutput(
            rewards=rewards,
            per_func=per_func,
            num_unscorable=sum(r is None for r in rewards),
            num_timeouts=counts[TIMEOUT],
            num_crashed=counts[CRASHED],
            num_batch_timeouts=counts[BATCH_TIMEOUT],
        )

    def _score(
        self, completions: list[str], columns: dict[str, list]
    ) -> tuple[dict[str, list[float | None]], dict[str, int]]:
        n = len(completions)
        counts = {TIMEOUT: 0, CRASHED: 0, BATCH_TIMEOUT: 0}
        if self.timeout_s is None and self.batch_timeout_s is None and self.num_workers == 0:
            per_func = {}
            for name, func in self.reward_funcs.items():
                values = list(func(completions, **columns))
                if len(values) != n:
                    raise ValueError(
                        f"reward function {name!r} returned {len(values)} values for {n} completions"
                    )
                per_func[name] = values
            return per_func, counts

        # Completion by completion, so a batch cut leaves whole completions scored.
        items = []
        for i in range(n):
            row = {k: [v[i]] for k, v in columns.items()}
            for name in self.reward_funcs:
                items.append((name, ([completions[i]],), row))
        if self._pool is not None:
            results = self._pool.run(items, batch_timeout_s=self.batch_timeout_s)
        else:
            results = run_in_thread(self.reward_funcs, items, self.timeout_s, self.batch_timeout_s)

        per_func: dict[str, list[float | None]] = {name: [] for name in self.reward_funcs}
        for (name, _, _), res in zip(items, results, strict=True):
            per_func[name].append(self._value(name, len(per_func[name]), res))
            if res.status in counts:
                counts[res.status] += 1
        return per_func, counts

    @staticmethod
    def _value(name: str, index: int, res: CallResult) -> float | None:
        if res.status == OK:
            values = list(res.value)
            if len(values) != 1:
                raise ValueError(f"reward function {name!r} returned {len(values)} values for 1 completion")
            return values[0]
        if res.status == ERROR:
            raise RuntimeError(f"reward function {name!r} raised on completion {index}:\n{res.value}")
        return None  # timeout (per call or batch) or crashed worker: unscorable, counted

    # ------------------------------------------------------------------------------------ gold checks
    def unscorable_golds(self, answers: Sequence[str]) -> list[int]:
        """Indices of gold answers that some weighted function cannot score.

        Uses each function's ``gold_is_scorable(answer)`` when it has one (functions without it are
        assumed to accept any gold).
        """
        checks = [
            func.gold_is_scorable
            for name, func in self.reward_funcs.items()
            if self.reward_weights[name] != 0 and hasattr(func, "gold_is_scorable")
        ]
        return [i for i, a in enumerate(answers) if not all(check(a) for check in checks)]

    def filter_rows(self, rows: Sequence[dict], where: str = "data") -> tuple[list[dict], int]:
        """Drop task rows whose gold no verifier can parse, before training; log how many.

        Args:
            rows: task rows (with ``answer`` and ``uid``).
            where: a name for messages (e.g. ``"gsm8k train"``).

        Returns:
            The kept rows and the number skipped.

        Raises:
            ValueError: if a row has no ``answer`` key (names the row) or if every row is unscorable.
        """
        for i, row in enumerate(rows):
            if "answer" not in row:
                raise ValueError(f"{where}: row {i} has no 'answer' column (columns: {sorted(row)})")
        bad = set(self.unscorable_golds([row["answer"] for row in rows]))
        if bad and len(bad) == len(rows):
            examples = [rows[i]["answer"] for i in sorted(bad)[:3]]
            raise ValueError(f"{where}: no gold answer can be parsed by {self.names} (e.g. {examples})")
        if bad:
            uids = [rows[i].get("uid", i) for i in sorted(bad)[:5]]
            log.warning(
                "%s: skipping %d of %d rows whose gold cannot be parsed (e.g. %s)",
                where,
                len(bad),
                len(rows),
                uids,
            )
        return [row for i, row in enumerate(rows) if i not in bad], len(bad)

    # ------------------------------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop worker processes, if any (they restart on the next call)."""
        if self._pool is not None:
            self._pool.close()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pool"] = None  # processes do not travel; a copy starts its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.num_workers > 0:
            self._pool = ProcessPool(self.reward_funcs, self.num_workers, self.timeout_s)

    def __repr__(self) -> str:
        return (
            f"Verifier(funcs={self.names}, weights={self.reward_weights}, timeout_s={self.timeout_s}, "
            f"batch_timeout_s={self.batch_timeout_s}, "
            f"num_workers={self.num_workers}, on_truncated={self.on_truncated!r})"
        )
