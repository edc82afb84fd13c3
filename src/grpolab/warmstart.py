"""Supervised warm start of the tiny embedded model on a task's reference answers.

A randomly initialised model earns no reward, so GRPO would see only zero-variance groups. A few hundred
supervised steps on ``prompt + answer + eos`` bring it to a modest accuracy; we stop at a *target
accuracy*, not a step count, because on 2-digit addition accuracy jumps from ~0.2 to ~0.65 within a few
hundred steps and a fixed count lands anywhere in that jump.

The accuracy used for stopping is exact rather than sampled: the probability that a sample at
``temperature`` is exactly the gold answer followed by the stop token, i.e. ``exp(sum_t log p_T(y_t))``
from one teacher-forced forward pass, averaged over held-out prompts.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from grpolab.algo.logprobs import token_log_probs

log = logging.getLogger(__name__)

DEFAULT_PATIENCE = 50  # evaluations (500 steps at eval_every=10) without improvement before a warm start gives up
MIN_REL_IMPROVEMENT = 0.01  # what counts as an improvement: 1% above the best accuracy so far (relative, so the
# first steps from a random model, where accuracy grows by factors from ~1e-9, count as improving)


def check_patience(warmstart: dict | None) -> dict | None:
    """``warmstart``, after refusing a ``model.warmstart.patience`` that is not null or an int >= 1 (called when the
    model's config is built, before any model).

    Raises:
        ConfigError: naming ``model.warmstart.patience`` and the value.
    """
    from grpolab.errors import ConfigError

    value = (warmstart or {}).get("patience")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"model.warmstart.patience must be null (never stop early) or an integer >= 1 "
                          f"(evaluations without a gain), got {value!r}")
    return warmstart


def stalled(history: list[float], patience: int | None) -> bool:
    """Whether the best of the last ``patience`` held-out accuracies is at most :data:`MIN_REL_IMPROVEMENT`
    (relative) above the best before them. ``history[0]`` is the accuracy before training; ``None``: never."""
    if patience is None or len(history) <= patience:
        return False
    before, recent = max(history[:-patience]), max(history[-patience:])
    return recent <= before * (1.0 + MIN_REL_IMPROVEMENT)


def plateau_message(history: list[float], step: int, eval_every: int, patience: int, target: float) -> str:
    """The error of a warm start that stopped improving: how far it got, and what can help (not more steps)."""
    best = max(history)
    lower = f"a target it reached (model.warmstart.target_accuracy={_below(best)}), " if best >= 0.02 else ""
    return (
        f"warm start: held-out accuracy stopped improving at {best:.3f} (no gain over {MIN_REL_IMPROVEMENT:.0%} in "
        f"the last {patience} evaluations, {patience * eval_every} steps; stopped at step {step}), below "
        f"model.warmstart.target_accuracy={target}: more steps will not help. The tiny model may not be able to "
        f"learn this task from these rows (docs/guide/own-data.md#the-tiny-models-limits). What can: {lower}"
        "a bigger tiny model (model.hidden_size=256 model.num_hidden_layers=8), more or simpler training rows, "
        "model.warmstart=null (GRPO from random weights: the reward stays 0 unless a sample is right by chance), "
        "or a real model (model=qwen0.5b; model=tiny_qwen model.tokenizer_path=... checks the data path). "
        "model.warmstart.patience=null never stops early"
    )


def _below(acc: float) -> str:
    """A round target just under ``acc`` (at least 0.01)."""
    return f"{max(0.01, int(acc * 100) / 100 - 0.01):.2f}"


def _encode(tokenizer: Any, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + answer + eos`` ids [B, T], attention mask [B, T], answer mask [B, T]."""
    seqs, answer_masks = [], []
    for row in rows:
        p = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        answer_masks.append([0] * len(p) + [1] * len(a))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    amask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, answer_masks)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        amask[i, : len(m)] = torch.tensor(m, dtype=torch.bool)
    return ids, attn, amask


def answer_log_probs(model: Any, ids: torch.Tensor, attn: torch.Tensor, amask: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """Per-row sum of log-probs of the answer tokens (and stop token) under ``temperature``. Shape [B]."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    logp = token_log_probs(logits, ids[:, 1:], temperature)
    return (logp * amask[:, 1:]).sum(-1)


@torch.no_grad()
def expected_accuracy(model: Any, tokenizer: Any, rows: list[dict], temperature: float = 1.0) -> float:
    """Mean over ``rows`` of P(sampled completion == gold answer + stop) at ``temperature``."""
    was_training = model.training
    model.eval()
    ids, attn, amask = _encode(tokenizer, rows)
    acc = answer_log_probs(model, ids, attn, amask, temperature).exp().mean().item()
    model.train(was_training)
    return acc


def warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[dict],
    target_accuracy: float = 0.25,
    temperature: float = 1.0,
    learning_rate: float = 1e-3,
    batch_size: int = 64,
    max_steps: int = 3000,
    eval_every: int = 10,
    num_heldout: int = 256,
    seed: int = 0,
    patience: int | None = DEFAULT_PATIENCE,
) -> dict:
    """Train ``model`` in place on ``rows`` until held-out expected accuracy >= ``target_accuracy``.

    The last ``num_heldout`` rows are held out for the stopping test; the others are trained on. A progress
    bar on stderr counts steps (out of ``max_steps``, an upper bound: it stops at the target) with the held-out
    accuracy, the rate and an estimated time to the target from the accuracy's progress so far; one log line
    reports the result.

    It also stops early, with an error, once the accuracy has stopped improving: when the best of the last
    ``patience`` evaluations is no more than :data:`MIN_REL_IMPROVEMENT` (relative) above the best before them
    (:func:`stalled`; ``None`` = never). A model that cannot learn the task then fails in minutes, not after
    ``max_steps``, with advice that fits a plateau rather than "train longer".

    Returns:
        A report dict: ``steps``, ``heldout_accuracy``, ``target_accuracy``, ``seconds``.

    Raises:
        ValueError: on a target outside (0, 1) or too few rows.
        RuntimeError: if the accuracy stops improving (:func:`plateau_message`) or ``max_steps`` pass without
            reaching the target (the message says how far it got).
    """
    if not 0.0 < target_accuracy < 1.0:
        raise ValueError(f"model.warmstart.target_accuracy must be in (0, 1), got {target_accuracy}")
    if patience is not None and (isinstance(patience, bool) or int(patience) < 1):
        raise ValueError(f"model.warmstart.patience must be an integer >= 1 or null, got {patience!r}")
    if len(rows) <= num_heldout:
        raise ValueError(f"warm start needs more than num_heldout={num_heldout} training rows, got {len(rows)}")
    train, heldout = rows[:-num_heldout], rows[-num_heldout:]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    start = time.perf_counter()
    model.train()
    acc = acc0 = expected_accuracy(model, tokenizer, heldout, temperature)
    step = 0
    history = [acc]  # the held-out accuracy at step 0 and at every evaluation
    bar = tqdm(total=max_steps, desc="warm start", unit="step", leave=False, dynamic_ncols=True,
               bar_format="{desc}: {n_fmt} steps (at most {total_fmt}) [{elapsed}, {rate_fmt}{postfix}]")
    bar.set_postfix_str(f"acc={acc:.3f}/{target_accuracy:.2f}")
    while acc < target_accuracy:
        if step >= max_steps:
            bar.close()
            if stalled(history, patience or DEFAULT_PATIENCE):
                raise RuntimeError(plateau_message(history, step, eval_every, patience or DEFAULT_PATIENCE,
                                                   target_accuracy))
            raise RuntimeError(
                f"warm start: held-out accuracy {acc:.3f} after {step} steps, below "
                f"model.warmstart.target_accuracy={target_accuracy} and still rising; raise "
                f"model.warmstart.max_steps"
            )
        ids, attn, amask = _encode(tokenizer, rng.sample(train, batch_size))
        loss = -answer_log_probs(model, ids, attn, amask).sum() / amask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        bar.update(1)
        if step % eval_every == 0:
            acc = expected_accuracy(model, tokenizer, heldout, temperature)
            eta = eta_to_target(acc0, acc, target_accuracy, time.perf_counter() - start)
            bar.set_postfix_str(f"acc={acc:.3f}/{target_accuracy:.2f}" + (f", eta~{eta:.0f}s" if eta else ""))
            history.append(acc)
            if acc < target_accuracy and stalled(history, patience):
                bar.close()
                raise RuntimeError(plateau_message(history, step, eval_every, patience, target_accuracy))
    bar.close()
    model.eval()
    report = {"steps": step, "heldout_accuracy": acc, "target_accuracy": target_accuracy,
              "seconds": round(time.perf_counter() - start, 2)}
    log.info("warm start: held-out accuracy %.3f after %d steps in %.0f s", acc, step, report["seconds"])
    return report


def eta_to_target(start_acc: float, acc: float, target: float, elapsed_s: float) -> float | None:
    """Seconds to ``target`` if accuracy keeps rising at its average rate so far; None before it has risen.

    A rough guide: accuracy on the addition task rises slowly, then jumps, so the estimate errs long.
    """
    if acc <= start_acc or elapsed_s <= 0:
        return None
    return max(target - acc, 0.0) * elapsed_s / (acc - start_acc)
