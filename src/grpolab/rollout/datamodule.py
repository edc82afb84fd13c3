"""RolloutDataModule: rollout buffers refreshed every ``steps_per_generation`` optimizer steps.

The training dataloader yields lightweight tickets; the real minibatch is produced in
``on_before_batch_transfer``, which Lightning calls right before each training step, after the previous
optimizer step. (Lightning's fetcher reads one batch ahead, so sampling inside the dataset iterator would
use the policy from one step too early.) Every ``steps_per_generation`` steps the *current* policy samples
a buffer of ``steps_per_generation`` minibatches with fresh prompts; minibatch ``j`` is trained on at lag
``j``, which is exactly sampling from alpha = pi_{k - lag} (paper.md §2.1, design.md §1), and each
minibatch serves ``num_iterations`` consecutive steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from grpolab.config import GRPOConfig
from grpolab.errors import NonFiniteLossError
from grpolab.rollout.buffer import Minibatch, PromptSampler
from grpolab.rollout.engine import GenerationEngine
from grpolab.rollout.producer import RolloutProducer
from grpolab.rollout.resume import buffer_settings, changed_buffer_settings

log = logging.getLogger(__name__)


@dataclass
class Ticket:
    """Placeholder batch: 'produce the next training minibatch here'."""

    serial: int


class _Tickets(IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            yield Ticket(i)
            i += 1


def _identity(batch: Any) -> Any:
    return batch


class RolloutDataModule(L.LightningDataModule):
    """Produces GRPO minibatches from the live policy; validation batches are lists of held-out rows.

    Args:
        task: a :class:`~grpolab.tasks.base.Task`.
        reward_model: callable ``(completions, **columns) -> RewardOutput``.
        engine: the generation engine.
        cfg: validated :class:`~grpolab.config.GRPOConfig`.
        seed: seeds the prompt order and the sampling RNG of each refresh.
        val_batch_size: held-out prompts per validation batch.
        resume_drop_buffer: on resume with settings that shape the rollout buffer changed (see
            :data:`BUFFER_SETTINGS`), drop the saved buffer and sample a new one instead of refusing.

    Call :meth:`connect` with the :class:`~grpolab.module.GRPOModule` before ``trainer.fit``.
    """

    def __init__(self, task: Any, reward_model: Any, engine: GenerationEngine, cfg: GRPOConfig, seed: int = 0,
                 val_batch_size: int = 64, resume_drop_buffer: bool = False) -> None:
        super().__init__()
        self.task = task
        self.reward_model = reward_model
        self.engine = engine
        self.cfg = cfg
        self.seed = seed
        self.val_batch_size = val_batch_size
        self.resume_drop_buffer = resume_drop_buffer
        self.module: Any = None
        self.producer: RolloutProducer | None = None
        self.sampler: PromptSampler | None = None
        self.buffer: list[Minibatch] = []
        self.position = 0  # steps served from the current buffer
        self.rounds = 0  # sampler refreshes so far
        self.time_rollout_s = 0.0
        self.skipped_rows = {"train": 0, "val": 0}
        self._filtered = False

    def connect(self, module: Any) -> None:
        """Attach the module that owns the live policy (its ``policy``, ``reference``, ``tokenizer``)."""
        self.module = module
        self.producer = RolloutProducer(self.cfg, self.task, module.tokenizer, self.engine, self.reward_model)
        module.producer = self.producer

    def setup(self, stage: str | None = None) -> None:
        if self.module is None:
            raise RuntimeError("RolloutDataModule.connect(module) must be called before fit/validate")
        splits = self.task.splits()
        if not self._filtered and hasattr(self.reward_model, "filter_rows"):
            # Rows whose gold no verifier can parse are skipped and counted, never scored (pitfalls.md #12).
            for name in ("train", "val"):
                kept, skipped = self.reward_model.filter_rows(splits[name], where=f"{self.task.name} {name}")
                splits[name][:] = kept
                self.skipped_rows[name] = skipped
            self._filtered = True
        _, world = self._rank_world()
        need = self.cfg.prompts_per_step * world
        if len(splits["train"]) < need:
            raise ValueError(
                f"{self.task.name}: the training split has {len(splits['train'])} usable rows, fewer than the "
                f"{need} distinct prompts one step needs (algo.per_device_train_batch_size="
                f"{self.cfg.per_device_train_batch_size} / algo.num_generations={self.cfg.num_generations}"
                + (f" x {world} processes" if world > 1 else "") + "); add rows, lower data.val_size / "
                "data.test_size, or lower algo.per_device_train_batch_size")
        if self.sampler is None:
            self.sampler = PromptSampler(len(splits["train"]), self.seed)
        if not splits["val"]:
            raise ValueError("data.val_size is 0: validation needs held-out prompts")

    # ---------------------------------------------------------------------------------- dataloaders
    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Tickets(), batch_size=None, collate_fn=_identity)

    def val_dataloader(self) -> DataLoader:
        rows = self.task.splits()["val"]
        chunks = [rows[i:i + self.val_batch_size] for i in range(0, len(rows), self.val_batch_size)]
        return DataLoader(chunks, batch_size=None, collate_fn=_identity)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, Ticket):
            return self.next_minibatch()
        return batch

    # ------------------------------------------------------------------------------------- rollouts
    @property
    def steps_per_buffer(self) -> int:
        return self.cfg.steps_per_generation * self.cfg.num_iterations

    def next_minibatch(self) -> Minibatch:
        """The minibatch for the coming optimizer step, refreshing the buffer when it is used up."""
        if self.position >= self.steps_per_buffer or not self.buffer:
            self.refresh()
        mb = self.buffer[self.position // self.cfg.num_iterations]
        mb.iteration = self.position % self.cfg.num_iterations
        self.position += 1
        return mb

    def refresh(self) -> None:
        """Sample a new buffer with the current policy (the sampler alpha becomes pi_k)."""
        start = time.perf_counter()
        train = self.task.splits()["train"]
        n = self.cfg.steps_per_generation * self.cfg.prompts_per_step
        # Under DDP every rank draws the same global order and keeps its own disjoint slice; a group
        # (one prompt x num_generations completions) never spans ranks.
        rank, world = self._rank_world()
        indices = self.sampler.take(n * world)[rank * n:(rank + 1) * n]
        rows = [train[i] for i in indices]
        # Each refresh has its own seed, so a resumed run samples exactly what the original run sampled.
        torch.manual_seed((self.seed * 1_000_003 + self.rounds) * world + rank)
        step = self.module.global_step if self.module._trainer is not None else 0
        self.engine.sync_weights(self.module.policy)
        try:
            self.buffer = self.producer.produce(self.module.policy, self.module.reference, rows, self.rounds, step)
        except RuntimeError as err:
            if "inf" in str(err) or "nan" in str(err):
                raise NonFiniteLossError(f"step {step}: sampling failed, the policy's probabilities are non-finite "
                                         f"({err}); lower algo.learning_rate") from err
            raise
        self.rounds += 1
        self.position = 0
        self.time_rollout_s += time.perf_counter() - start

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self.module, "_trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    # ----------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict() if self.sampler else None, "buffer": [mb.to_dict() for mb in self.buffer],
                "position": self.position, "rounds": self.rounds, "time_rollout_s": self.time_rollout_s,
                "counters": dict(self.producer.counters) if self.producer else {},
                "settings": buffer_settings(self.cfg)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sampler is None:
            self.sampler = PromptSampler(len(self.task.splits()["train"]), self.seed)
        if state.get("sampler"):
            self.sampler.load_state_dict(state["sampler"])
        changed = changed_buffer_settings(state.get("settings"), self.cfg)
        if changed and not self.resume_drop_buffer:
            raise ValueError(
                "resuming with settings that shape the saved rollout buffer changed: " + ", ".join(changed)
                + ". Resume with the checkpoint's values, or pass resume_drop_buffer=true to drop the saved buffer "
                "and sample a new one with the new settings"
            )
        if changed:
            log.warning("resume_drop_buffer=true: dropping the saved rollout buffer (%s); the next step samples "
                        "a new one", ", ".join(changed))
        self.buffer = [] if changed else [Minibatch.from_dict(d) for d in state["buffer"]]
        self.position = 0 if changed else state["position"]
        self.rounds = state["rounds"]
        self.time_rollout_s = state.get("time_rollout_s", 0.0)
        if self.producer is not None:
            self.producer.counters.update(state.get("counters", {}))
