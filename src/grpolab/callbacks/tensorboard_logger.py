"""``logger=tensorboard``: Lightning's :class:`~lightning.pytorch.loggers.TensorBoardLogger` with the composed config
as hyperparameters and one TensorBoard run across resumes (``conf/logger/tensorboard.yaml``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from grpolab.callbacks.resumed_run import checkpoint_run_dir, checkpoint_step, is_rank_zero
from grpolab.callbacks.tensorboard_events import carry_events

HPARAM_VALUES = (int, float, str, bool)  # what TensorBoard's hparams plugin takes; anything else is logged as text


class ResumableTensorBoardLogger(TensorBoardLogger):
    """A :class:`~lightning.pytorch.loggers.TensorBoardLogger` whose run goes on across resumes.

    With ``ckpt_path`` set, the events the checkpoint's run logged before the checkpoint's step are carried into
    this run's log folder first (:func:`~grpolab.callbacks.tensorboard_events.carry_events`; the same folder for a
    multirun rerun or a requeued SLURM job, ``<new run>/<name>/<version>`` for a resume by hand), so the folder
    holds the whole run, each step once, steps and wall times increasing. ``log_hyperparams`` without metrics
    writes the hyperparameters for TensorBoard's HParams tab, naming ``hparam_metrics`` as the metrics to show
    beside them (Lightning's own logger writes nothing then, or a placeholder ``hp_metric``); a resumed run writes
    them at its first step.

    Args:
        save_dir: the run folder.
        name: the log folder under it (``tensorboard``).
        version: a sub-folder of that; ``""``: none (one run per run folder).
        ckpt_path: the checkpoint the run resumes from (its run folder's events are carried), or None.
        hparam_metrics: the scalar tags the HParams tab shows next to each run's hyperparameters.
        **kwargs: other ``TensorBoardLogger`` arguments (``prefix``, ``sub_dir``, ``SummaryWriter``'s).
    """

    def __init__(self, save_dir: str, name: str = "tensorboard", version: str = "", ckpt_path: str | None = None,
                 hparam_metrics: Sequence[str] = ("val/accuracy", "train/reward"), **kwargs: Any) -> None:
        kwargs.setdefault("default_hp_metric", False)
        super().__init__(save_dir, name=name, version=version, **kwargs)
        self.hparam_metrics = list(hparam_metrics)
        self.start_step = 0
        if ckpt_path and is_rank_zero():
            self.start_step = checkpoint_step(ckpt_path)
            here = Path(self.log_dir)
            carry_events(checkpoint_run_dir(ckpt_path) / here.resolve().relative_to(Path(save_dir).resolve()),
                         here, self.start_step)

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: dict[str, Any] | None = None, step: int | None = None) -> None:
        """Lightning's ``log_hyperparams`` (``hparams.yaml``; with ``metrics``, those too); without metrics, the
        (flat) ``params`` for the HParams tab at :attr:`start_step`, non-scalar values as text."""
        super().log_hyperparams(params, metrics=metrics, step=step)
        if metrics is not None or not self.hparam_metrics:
            return
        from torch.utils.tensorboard.summary import hparams

        flat = {k: v if v is None or isinstance(v, HPARAM_VALUES) else str(v) for k, v in dict(params).items()}
        writer = self.experiment._get_file_writer()  # as Lightning's TensorBoardLogger.log_hyperparams writes them
        for summary in hparams(flat, dict.fromkeys(self.hparam_metrics, 0.0)):
            writer.add_summary(summary, self.start_step if step is None else step)
