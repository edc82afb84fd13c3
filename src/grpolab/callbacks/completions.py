"""A Lightning callback that shows what the policy writes: a table of completions every N steps.

Each logged row holds the prompt, the completion, the gold answer, the reward and the advantage the step
trained on, plus the step, the minibatch's lag behind the sampler and its reuse iteration. Rows go to
``<run>/completions.jsonl`` (appended, one JSON object a line) and, when a
:class:`~lightning.pytorch.loggers.WandbLogger` is attached, to a W&B table under ``completions``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import lightning as L

log = logging.getLogger(__name__)

COLUMNS = ["step", "uid", "prompt", "completion", "gold", "reward", "advantage", "truncated", "lag", "iteration"]


def completion_rows(batch: Any, step: int, max_rows: int | None = None) -> list[dict[str, Any]]:
    """Plain rows from a training :class:`~grpolab.rollout.buffer.Minibatch`.

    Rows keep the minibatch order (completions of one prompt are adjacent), so the first ``max_rows``
    rows hold whole groups when ``max_rows`` is a multiple of the group size.

    Args:
        batch: a minibatch with ``info`` (``uids``, ``prompts``, ``completions``, ``answers``) and tensors
            ``rewards`` [B], ``advantages`` [B], ``truncated`` [B].
        step: optimizer steps taken, this one included.
        max_rows: keep at most this many rows (None = all).

    Returns:
        One dict per completion with the keys of :data:`COLUMNS`; a NaN reward (unscorable) is ``None``.
    """
    info = batch.info
    n = len(info["completions"]) if max_rows is None else min(max_rows, len(info["completions"]))
    rewards, advantages = batch.rewards.tolist(), batch.advantages.tolist()
    truncated = batch.truncated.tolist()
    rows = []
    for i in range(n):
        reward = rewards[i]
        rows.append({
            "step": int(step), "uid": info["uids"][i], "prompt": info["prompts"][i],
            "completion": info["completions"][i], "gold": info["answers"][i],
            "reward": None if math.isnan(reward) else float(reward), "advantage": float(advantages[i]),
            "truncated": bool(truncated[i]), "lag": int(batch.lag), "iteration": int(batch.iteration),
        })
    return rows


class CompletionsLogger(L.Callback):
    """Log a sample of the training completions at step 1 and every ``every_n_steps`` optimizer steps.

    Args:
        every_n_steps: period in optimizer steps (>= 1); step 1 is always logged.
        max_rows: completions per logged step (the first ones of the minibatch; whole groups when it is
            a multiple of ``algo.num_generations``).
        path: JSONL file to append to (``${paths.output_dir}/completions.jsonl``); None = none.
        table_key: W&B key of the table.

    Raises:
        ValueError: if ``every_n_steps`` or ``max_rows`` is < 1.
    """

    def __init__(self, every_n_steps: int = 50, max_rows: int = 16, path: str | None = None,
                 table_key: str = "completions") -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"callbacks.completions.every_n_steps must be >= 1, got {every_n_steps}")
        if max_rows < 1:
            raise ValueError(f"callbacks.completions.max_rows must be >= 1, got {max_rows}")
        self.every_n_steps = every_n_steps
        self.max_rows = max_rows
        self.path = Path(path) if path else None
        self.table_key = table_key

    def due(self, step: int) -> bool:
        """Whether the step (optimizer steps taken, 1-based) is logged."""
        return step == 1 or step % self.every_n_steps == 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = int(trainer.global_step)
        if not trainer.is_global_zero or not self.due(step) or not hasattr(batch, "info"):
            return
        rows = completion_rows(batch, step, self.max_rows)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for logger in trainer.loggers:
            if type(logger).__name__ == "WandbLogger":  # no wandb import unless such a logger exists
                logger.log_table(key=self.table_key, columns=COLUMNS,
                                 data=[[row[c] for c in COLUMNS] for row in rows], step=step)
