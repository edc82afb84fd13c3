"""Per-step training metrics straight to the loggers, bypassing ``LightningModule.log_dict``.

``log_dict`` keeps a ``ResultCollection`` entry per key (tensor conversion, reduction metadata, checks):
about 0.2 ms per key on a CPU, so ~10 ms for the ~50 metrics of a GRPO step, 5-10% of a tiny-model step.
The per-step metrics need none of that (no epoch reduction, no sync, no progress bar), so they go to the
loggers the way Lightning's logger connector writes them: same step index, same ``epoch`` column, same
``log_every_n_steps`` rule; ``trainer.logged_metrics`` and ``trainer.callback_metrics`` are still updated.
"""

from __future__ import annotations

from typing import Any

import torch


def log_step_metrics(trainer: Any, metrics: dict[str, Any]) -> None:
    """Write ``metrics`` (floats or 0-d tensors) for the current training step to every logger.

    Tensors are converted with one ``tolist`` (one host sync). ``trainer.callback_metrics`` gets every
    value each step; the loggers get them when ``trainer.log_every_n_steps`` says so.
    """
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    if names:
        values = torch.stack([metrics[k].detach().reshape(()).to(torch.float64) for k in names]).cpu().tolist()
        metrics = {**metrics, **dict(zip(names, values, strict=True))}
    metrics = {k: float(v) for k, v in metrics.items()}
    connector = trainer._logger_connector
    # Callbacks (progress bar, early stopping, checkpoint monitors) read them as log_dict would leave them.
    connector._callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
    if trainer.loggers and connector.should_update_logs:
        connector.log_metrics(metrics)
