"""The end-of-training held-out evaluation (``final_eval`` in ``conf/train.yaml``; the claim sweeps turn it on).

After the last optimizer step, the trained policy is scored on a split of the task (the test split by default)
with ``num_samples`` completions per prompt at the training temperature, by the evaluator of
:mod:`grpolab.evaluation.evaluate` (the same records and :func:`~grpolab.evaluation.evaluate.summarize`), so
``summary.json`` gets an accuracy whose standard error is about one point (mean@16 on 1024 prompts) instead of
the noisy periodic ``val/accuracy``.

The standard error is over PROMPTS: ``std_j(a_j) / sqrt(m)`` with ``a_j`` the fraction of the ``n`` samples of
prompt ``j`` that are correct and ``m`` the number of prompts (ddof 1). It measures the sampling noise of this
policy's score on this prompt set; seed-to-seed variation of training is a separate, larger term that the sweep's
notebook estimates from the seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpolab.errors import ConfigError
from grpolab.evaluation.evaluate import _records, answer_extractor, select_rows, summarize


class FinalEvalStopped(Exception):
    """:func:`final_eval` was asked to stop (its ``should_stop`` returned True); nothing was scored."""


def check_final_eval(cfg: Any) -> None:
    """Validate a ``final_eval`` config node before any model is built.

    Raises:
        ValueError: naming the ``final_eval.<key>`` at fault.
    """
    if not cfg:
        return
    if not isinstance(cfg.get("enabled", False), bool):
        raise ConfigError(f"final_eval.enabled must be true or false, got {cfg.get('enabled')!r}")
    if not cfg.enabled:
        return
    if cfg.split not in ("train", "val", "test"):
        raise ConfigError(f"final_eval.split must be train, val or test, got {cfg.split!r}")
    for key in ("num_samples", "batch_size"):
        if isinstance(cfg[key], bool) or not (isinstance(cfg[key], int) and cfg[key] >= 1):
            raise ConfigError(f"final_eval.{key} must be an int >= 1, got {cfg[key]!r}")
    if cfg.get("max_prompts") is not None and not (isinstance(cfg.max_prompts, int) and cfg.max_prompts >= 1):
        raise ConfigError(f"final_eval.max_prompts must be null or an int >= 1, got {cfg.max_prompts!r}")
    ks = cfg.get("ks")
    if ks is not None:
        items = list(ks) if not isinstance(ks, (str, int, float)) else None
        bad = [k for k in items or [] if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg.num_samples]
        if not items or bad:
            raise ConfigError(f"final_eval.ks must be null or a list of ints in [1, final_eval.num_samples="
                              f"{cfg.num_samples}] (pass@k needs n >= k samples), got {ks!r}")


@torch.no_grad()
def final_eval(policy: Any, producer: Any, task: Any, split: str = "test", num_samples: int = 16,
               max_prompts: int | None = None, batch_size: int = 64, seed: int = 2024,
               correct_threshold: float = 1.0, should_stop: Callable[[], bool] | None = None,
               ks: Sequence[int] | None = None) -> dict[str, Any]:
    """Score ``policy`` on ``split``: ``num_samples`` sampled completions per prompt, plus one greedy.

    Args:
        policy: the trained policy (put in eval mode for the call, restored after).
        producer: a :class:`~grpolab.rollout.producer.RolloutProducer` with the training sampling settings and
            verifier whose engine samples ``policy`` itself (the module's validation producer); its counters are
            left as they were.
        task: the task whose ``split`` is scored.
        split: ``train`` | ``val`` | ``test``.
        num_samples: n of mean@n.
        max_prompts: score only the first N prompts of the split (None = all).
        batch_size: prompts per generate call.
        seed: seeds the sampling RNG (the global RNG state is restored afterwards, so a resumed run is unaffected).
        correct_threshold: a sample is correct when its reward is at least this.
        should_stop: called after each batch (every rank calls it equally often); True stops the eval.
        ks: the budgets of pass@k (each in [1, ``num_samples``]); ``num_samples`` itself is always one. pass@k is
            the unbiased estimator of Chen et al. 2021 from the ``num_samples`` samples of each prompt
            (:func:`grpolab.evaluation.metrics.pass_at_k`: ``1 - C(n-c, k) / C(n, k)``), averaged over prompts.

    Raises:
        FinalEvalStopped: when ``should_stop`` returned True (nothing is scored).

    Returns:
        ``{f"{split}_mean_at_{n}", f"{split}_mean_at_{n}_se", f"{split}_greedy_accuracy", f"{split}_num_prompts",
        f"{split}_pass_at_{k}"}`` for each k of ``ks`` and ``n`` (floats; NaN stands for "not measurable") and
        ``per_prompt``: uid -> fraction correct, for paired comparisons between runs on the same prompts.
    """
    rows = select_rows(task, split, max_prompts)
    counters = dict(producer.counters)
    rng = torch.get_rng_state()
    was_training = policy.training
    policy.eval()
    torch.manual_seed(seed)
    extract = answer_extractor(producer.verifier)
    records: list[dict] = []
    try:
        for s in range(0, len(rows), batch_size):
            batch = rows[s:s + batch_size]
            records += _records(producer.sample(policy, batch, num_samples), extract, correct_threshold, False,
                                num_samples)
            records += _records(producer.sample(policy, batch, 1, greedy=True), extract, correct_threshold, True, 1)
            if should_stop is not None and should_stop():
                raise FinalEvalStopped(f"final eval stopped after {s + len(batch)} of {len(rows)} prompts")
    finally:
        torch.set_rng_state(rng)
        policy.train(was_training)
        producer.counters.clear()
        producer.counters.update(counters)
    budgets = sorted({*(int(k) for k in (ks or ())), num_samples})
    out = summarize(records, num_samples, budgets, correct_threshold)
    per_prompt: dict[str, list[float]] = {}
    for r in records:
        if not r["greedy"] and not math.isnan(r["reward"]):
            per_prompt.setdefault(r["uid"], []).append(1.0 if r["reward"] >= correct_threshold else 0.0)
    n = num_samples
    return {
        f"{split}_mean_at_{n}": out["accuracy"],
        f"{split}_mean_at_{n}_se": out["accuracy_stderr"],
        **{f"{split}_pass_at_{k}": out[f"pass@{k}"] for k in budgets},
        f"{split}_greedy_accuracy": out.get("greedy_accuracy", math.nan),
        f"{split}_num_prompts": out["num_prompts"],
        "per_prompt": {uid: sum(v) / len(v) for uid, v in per_prompt.items()},
    }
