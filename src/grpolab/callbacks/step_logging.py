"""Per-step training metrics straight to the loggers, bypassing ``LightningModule.log_dict``.

``log_dict`` keeps a ``ResultCollection`` entry per key (tensor conversion, reduction metadata, checks):
about 0.2 ms per key on a CPU, so ~10 ms for the ~50 metrics of a GRPO step, 5-10% of a tiny-model step.
The per-step metrics need none of that (no epoch reduction, no progress bar), so they go to each logger's
public ``log_metrics(metrics, step)`` with what Lightning's logger connector writes for ``log_dict(on_step=True,
on_epoch=False)``: the same step index, the same ``epoch`` column, the same ``log_every_n_steps`` rule, a
``save()`` after each write. ``trainer.callback_metrics`` and ``trainer.logged_metrics`` (the public dicts
callbacks read) are updated too.

Under DDP / FSDP each rank's values are first combined over the ranks with ONE ``all_gather`` of a packed
float64 tensor (:mod:`grpolab.algo.metric_reduction`), so rank 0's loggers write the global batch's metrics,
not rank 0's own. One process does no collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grpolab.algo.metric_reduction import pack, reduce_metrics, unpack


def should_log(trainer: Any, step: int) -> bool:
    """Lightning's rule for writing training-step metrics: every ``trainer.log_every_n_steps`` batches
    (``(step + 1) % n == 0``; never when ``n == 0``), on the step that stops training, and every step of a
    ``fast_dev_run``.

    Args:
        trainer: the Lightning trainer (``log_every_n_steps``, ``should_stop``, ``fast_dev_run``).
        step: the 0-based index of the optimizer step being logged (see :func:`log_step_metrics`).
    """
    if trainer.fast_dev_run:
        return True
    n = trainer.log_every_n_steps
    return n != 0 and ((step + 1) % n == 0 or bool(trainer.should_stop))


def reduce_over_ranks(strategy: Any, metrics: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Every rank's ``metrics`` combined by :data:`~grpolab.algo.metric_reduction.RULES`: one ``all_gather``
    (a collective: every rank must call it, with the same metric and weight names).

    Args:
        strategy: the trainer's strategy (``all_gather`` -> ``[world_size, N]``, ``root_device``).
        metrics: this rank's metric name -> float.
        weights: this rank's weight name -> float (what its means were taken over).

    Returns:
        metric name -> the combined value, the same on every rank.

    Raises:
        ValueError: when the ranks reported different names, or a weight a rule needs is missing.
    """
    local = pack(metrics, weights).to(strategy.root_device)
    gathered = strategy.all_gather(local).reshape(-1, local.numel())
    per_rank, per_rank_weights = unpack(gathered, list(metrics), list(weights))
    return reduce_metrics(per_rank, per_rank_weights)


def log_step_metrics(trainer: Any, metrics: Mapping[str, Any], step: int,
                     weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Write the metrics of the training step ``step`` to every logger (when :func:`should_log` says so).

    ``step`` is the index Lightning's connector uses for ``log_dict``: the number of batches that had stepped
    the optimizer before this one (``fit_loop.epoch_loop._batches_that_stepped``, private). With one optimizer
    step per training batch (``GRPOModule``) that is ``trainer.global_step`` read at the START of
    ``training_step``, before ``optimizer.step()`` adds one; the caller passes that value.

    Args:
        trainer: the Lightning trainer.
        metrics: name -> float or 0-d tensor (tensors are converted with one host transfer).
        step: the 0-based index of this optimizer step (see above).
        weights: name -> float, what this rank's means were taken over
            (:mod:`grpolab.algo.metric_reduction`); needed when ``trainer.world_size > 1``, ignored otherwise.

    Returns:
        The values written (float), combined over ranks under DDP / FSDP.

    Raises:
        ValueError: ``trainer.world_size > 1`` without ``weights``, or the ranks' names differ.
    """
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    if names:
        values = torch.stack([metrics[k].detach().reshape(()).to(torch.float64) for k in names]).cpu().tolist()
        metrics = {**metrics, **dict(zip(names, values, strict=True))}
    out = {k: float(v) for k, v in metrics.items()}
    if trainer.world_size > 1:
        if weights is None:
            raise ValueError("log_step_metrics on several ranks needs the weights of each rank's means")
        out = reduce_over_ranks(trainer.strategy, out, weights)
    # Callbacks (progress bar, early stopping, checkpoint monitors) read them as log_dict would leave them: both
    # dicts hold every step's values (0-d tensors), also on the steps the loggers skip.
    tensors = dict(zip(out, torch.tensor(list(out.values())).unbind(), strict=True))  # ~4x faster than one by one
    trainer.callback_metrics.update(tensors)
    trainer.logged_metrics.update(tensors)
    if trainer.loggers and out and should_log(trainer, step):
        row = dict(out)
        row.setdefault("epoch", trainer.current_epoch)  # the column Lightning's connector adds
        for logger in trainer.loggers:
            logger.log_metrics(metrics=row, step=step)
            logger.save()
    return out


def log_validation_metrics(trainer: Any, metrics: Mapping[str, float], steps_done: int) -> None:
    """Write one validation row to every logger at ``step = steps_done`` (optimizer steps done so far).

    Lightning's connector writes epoch-end metrics of a validation inside ``fit`` at the count of batches that
    had stepped BEFORE the last one (49 after 50 steps), while ``summary.json``'s ``val_history`` and ``steps``
    count steps done (50). Writing the row here keeps ``metrics.csv`` on ``summary.json``'s numbering; the
    caller logs the same values with ``log_dict(..., logger=False)`` for the callbacks (checkpoint monitor,
    progress bar). Loggers write on rank 0 only (Lightning's loggers are ``rank_zero_only``).

    Args:
        trainer: the Lightning trainer (its ``loggers`` and ``current_epoch``).
        metrics: name -> float (``val/accuracy``, ...), the same on every rank.
        steps_done: ``trainer.global_step`` when the validation ran.
    """
    if not trainer.loggers or not metrics:
        return
    row = {k: float(v) for k, v in metrics.items()}
    row.setdefault("epoch", trainer.current_epoch)  # the column Lightning's connector adds
    for logger in trainer.loggers:
        logger.log_metrics(metrics=row, step=int(steps_done))
        logger.save()
