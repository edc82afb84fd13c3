"""A training progress bar in GRPO terms, and the Lightning warnings our setup triggers by design.

Lightning's bar counts batches of an epoch. A GRPO run has one endless epoch of rollout tickets, so it
read "Epoch 0/-2" with no total. :class:`GRPOProgressBar` counts optimizer steps out of
``trainer.max_steps`` and shows the last step's mean reward, the last held-out accuracy and the step rate:

    GRPO step:  40%|████      | 4/10 [00:02<00:03, reward=0.375, val_acc=0.250, steps/s=1.93]

:func:`silence_expected_lightning_warnings` filters, by message, the two Lightning warnings our design
triggers on purpose (see there); everything else Lightning says still shows.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar


class GRPOProgressBar(TQDMProgressBar):
    """Optimizer steps out of ``max_steps``, with reward, last val accuracy and steps/s.

    Args:
        refresh_rate: redraw every N optimizer steps (0 disables the bar).
        leave: keep the finished bar on screen.
    """

    # Lightning's format without tqdm's own "it/s" (our postfix says steps/s).
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"

    def __init__(self, refresh_rate: int = 1, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=False)
        self._leave_done = leave
        self._start_time = 0.0
        self._start_step = 0

    @property
    def train_description(self) -> str:
        return "GRPO step"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self.train_progress_bar.leave = self._leave_done
        self._start_time, self._start_step = time.perf_counter(), int(trainer.global_step)
        self._reset_bar(trainer)  # a run resumed mid-epoch gets no on_train_epoch_start (Lightning skips it)

    def on_train_epoch_start(self, trainer: Any, *_: Any) -> None:
        self._reset_bar(trainer)

    def _reset_bar(self, trainer: Any) -> None:
        """Total ``trainer.max_steps`` (none when unbounded), position ``trainer.global_step`` (a resumed run
        starts where it stopped)."""
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = 0
        bar.n = int(trainer.global_step)
        bar.set_description(self.train_description)  # redraws the bar

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        bar = self.train_progress_bar
        step = int(trainer.global_step)
        if bar is not None and not bar.disable and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, str]:
        """``reward`` (mean reward of the last step), ``val_acc`` (the last validation) and ``steps/s``."""
        metrics = trainer.callback_metrics
        out: dict[str, str] = {}
        if "train/reward" in metrics:
            out["reward"] = f"{float(metrics['train/reward']):.3f}"
        history = getattr(pl_module, "val_history", None)
        if history:
            out["val_acc"] = f"{float(history[-1]['accuracy']):.3f}"
        elif "val/accuracy" in metrics:
            out["val_acc"] = f"{float(metrics['val/accuracy']):.3f}"
        elapsed = time.perf_counter() - self._start_time
        steps = int(trainer.global_step) - self._start_step
        if elapsed > 0 and steps > 0:
            out["steps/s"] = f"{steps / elapsed:.2f}"
        return out


def silence_expected_lightning_warnings() -> None:
    """Filter the Lightning warnings that our design triggers on purpose (and only those), by message.

    - "does not have many workers": the training loader yields empty tickets and the validation loader
      chunks of rows; sampling happens in ``on_before_batch_transfer`` on the main process, so loader
      workers would have nothing to do (the filter Lightning's docs give in ``advanced/warnings``).
    - "Experiment logs directory ... exists and is not empty": the CSV logger writes ``metrics.csv``
      straight into the run folder, which already holds Hydra's ``train.log`` and ``.hydra/``.
    - "no pre-optimization state was saved": the periodic ``ModelCheckpoint`` under manual optimization saves the
      state AFTER the step's optimizer update, which is the state a resume at step N needs (the checkpoint of
      step N holds N updates); the warning reads like a checkpoint bug and is not one.
    - "``isinstance(treespec, LeafSpec)`` is deprecated": Lightning's own call into torch's pytree, nothing a user
      can change.

    Also leaves one console handler for Lightning's log lines (:func:`one_console_for_lightning`).
    """
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty.*")
    warnings.filterwarnings("ignore", message=r".*manual optimization and every_n_train_steps, but no pre-opt.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    one_console_for_lightning()


class _DropTips(logging.Filter):
    """Drops Lightning's advertising lines ("💡 Tip: ... litlogger")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in str(record.msg)


def one_console_for_lightning() -> None:
    """Lightning's log lines printed once, not twice: ``import lightning`` gives the ``lightning`` logger its own
    console handler ("INFO: ...") and lets its records reach the root logger too, where Hydra's job logging prints
    them again and writes ``train.log``. When the root logger has handlers (Hydra's), Lightning's own console
    handlers are removed; its records still reach the console and ``train.log`` through the root. Idempotent."""
    if not logging.getLogger().handlers:  # hydra/job_logging=disabled: Lightning's handler is the only one
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if type(h) is logging.StreamHandler:
                logger.removeHandler(h)
        logger.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)  # the loggers that emit the tips (a logger's filter sees its own records)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())
