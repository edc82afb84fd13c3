"""RolloutDataModule: the Lightning glue around the rollout buffer, and the composer of its parts' checkpoint states.

The training dataloader yields tickets; the real minibatch is made in ``on_before_batch_transfer``, right before each
training step, after the previous optimizer step (Lightning's fetcher reads one batch ahead). The buffer serves them
on its :class:`~grpolab.rollout.schedule.Schedule`; a refresh strategy (:mod:`grpolab.rollout.refresh`) samples them.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from functools import partial
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from grpolab.checkpoint.rank_state import with_rollout_ranks
from grpolab.config import GRPOConfig
from grpolab.distributed import reduce_floats_over_ranks
from grpolab.handle import PolicyHandle
from grpolab.rollout.buffer import Minibatch, RolloutBuffer
from grpolab.rollout.engines.base import GenerationEngine
from grpolab.rollout.producer import RolloutProducer
from grpolab.rollout.prompt_order import PromptOrder, check_split_sizes
from grpolab.rollout.refresh import SyncRefresh, make_refresh
from grpolab.rollout.resume import buffer_settings, resumable_state
from grpolab.rollout.rules.base import RefreshRules
from grpolab.rollout.sampler import SamplerPolicy
from grpolab.rollout.settings import RolloutConfig


@dataclass
class Ticket:
    """Placeholder training batch: 'make the next minibatch here'."""
    serial: int


class _Tickets(IterableDataset):
    def __iter__(self):
        return map(Ticket, itertools.count())


def _identity(batch: Any) -> Any:  # collate_fn: batches are made in on_before_batch_transfer
    return batch


class RolloutDataModule(L.LightningDataModule):
    """Produces GRPO minibatches from the live policy, and scored validation samples from held-out rows. Call
    :meth:`connect` before ``trainer.fit``.

    Args:
        task: a :class:`~grpolab.tasks.base.Task`.
        verifier: callable ``(completions, **columns) -> RewardOutput``.
        engine: the generation engine.
        cfg: validated :class:`~grpolab.config.GRPOConfig`.
        settings: validated :class:`~grpolab.rollout.settings.RolloutConfig` (default: synchronous).
        seed: seeds the prompt order and the sampling RNG of each refresh.
        val_batch_size: held-out prompts per validation batch.
        val_num_generations: samples per held-out prompt (mean@n at the training temperature), plus one greedy.
        resume_drop_buffer: on resume with settings that shape the saved buffer changed, drop it instead of refusing.
        val_max_prompts: periodic validation scores only the first N rows of the val split (None = all).
    """

    def __init__(self, task: Any, verifier: Any, engine: GenerationEngine, cfg: GRPOConfig,
                 settings: RolloutConfig | None = None, seed: int = 0, val_batch_size: int = 64,
                 val_num_generations: int = 4, resume_drop_buffer: bool = False,
                 val_max_prompts: int | None = None) -> None:
        super().__init__()
        if val_num_generations < 1:
            raise ValueError(f"val.num_generations must be >= 1, got {val_num_generations}")
        if val_max_prompts is not None and val_max_prompts < 1:
            raise ValueError(f"val.max_prompts must be null or an int >= 1, got {val_max_prompts}")
        self.task, self.verifier, self.engine, self.cfg, self.seed = task, verifier, engine, cfg, seed
        self.settings = settings or RolloutConfig()
        self.val_batch_size, self.val_num_generations = val_batch_size, val_num_generations
        self.val_max_prompts = val_max_prompts
        self.resume_drop_buffer = resume_drop_buffer
        self.models: PolicyHandle | None = None
        self.producer: RolloutProducer | None = None
        self.validation_producer: RolloutProducer | None = None
        self.sampler = SamplerPolicy(engine)
        self.buffer = RolloutBuffer(self.settings.schedule(cfg))
        self.prompts: PromptOrder | None = None
        self.refresh: SyncRefresh | None = None
        self.skipped_rows = {"train": 0, "val": 0}
        self.rules = RefreshRules(self.settings.refresh_rules(cfg), self.buffer.schedule)  # rollout.refresh

    def connect(self, tokenizer: Any, models: PolicyHandle) -> None:
        """Hand over what is known only once the model spec is built: the tokenizer and the policy handle."""
        self.models = models
        needs_logp = self.cfg.reuses_samples or self.settings.async_generation  # async trains at lag >= 1
        self.producer = RolloutProducer(self.cfg, self.task, tokenizer, self.engine, self.verifier, needs_logp)
        # its own counters: every rank validates the whole held-out set, so only training counts are summed
        self.validation_producer = self.producer.with_engine(self.engine.validation_engine(), own_counters=True)

    def setup(self, stage: str | None = None) -> None:
        if self.producer is None:
            raise RuntimeError("RolloutDataModule.connect(tokenizer, models) must be called before fit/validate")
        if self.prompts is not None:
            return
        splits = self.task.splits()
        if hasattr(self.verifier, "filter_rows"):  # rows whose gold no verifier can parse: skipped and counted
            for name in ("train", "val"):
                splits[name][:], self.skipped_rows[name] = self.verifier.filter_rows(splits[name],
                                                                                     where=f"{self.task.name} {name}")
        rank, world = self._rank_world()
        check_split_sizes(self.task.name, splits, self.cfg, world)
        self.prompts = PromptOrder(len(splits["train"]), self.seed)
        self.refresh = make_refresh(self.settings, self.producer, self.sampler, self.models, splits["train"],
                                    self.prompts, self.seed, rank, world, self._precision)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Tickets(), batch_size=None, collate_fn=_identity)

    def val_dataloader(self) -> DataLoader:
        rows = self.task.splits()["val"][:self.val_max_prompts]
        chunks = [rows[i:i + self.val_batch_size] for i in range(0, len(rows), self.val_batch_size)]
        return DataLoader(chunks, batch_size=None, collate_fn=_identity)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, Ticket):
            return self.next_minibatch()
        return self.validation_producer.sampled_and_greedy(self.models.policy, batch, self.val_num_generations)  # rows

    def next_minibatch(self) -> Minibatch:
        """The minibatch for the coming optimizer step, refilling the buffer when it is used up."""
        step = int(self.trainer.global_step) if self.trainer is not None else 0
        self.refresh.rescore_reference(self.buffer.remaining())  # the module refreshed its reference since
        reduce = partial(reduce_floats_over_ranks, self.trainer.strategy) if self._rank_world()[1] > 1 else None
        self.rules.before_step(step, self.buffer, self.models, reduce)  # may end the buffer early
        if self.buffer.needs_refresh():
            self.buffer.fill(self.refresh.refill(step, self.buffer.rounds))
        self.refresh.before_step(step, self.buffer, self.trainer.max_steps if self.trainer else None)
        mb = self.buffer.next(step)
        mb.metrics = {"time/rollout": self.refresh.time_rollout_s, "time/weight_sync": self.sampler.take_push_time(),
                      "rollout/sampler_restarts": float(self.sampler.restarts), **self.rules.metrics()}
        return mb

    def _rank_world(self) -> tuple[int, int]:
        return (int(self.trainer.global_rank), int(self.trainer.world_size)) if self.trainer is not None else (0, 1)

    def _precision(self) -> Any:
        """The training forward's precision context (bf16-mixed: autocast), so the lag-0 ratio is exactly 1."""
        return self.trainer.precision_plugin.forward_context() if self.trainer is not None else contextlib.nullcontext()

    def teardown(self, stage: str | None = None) -> None:
        """Join a buffer still in flight (bounded by the timeout), so no thread samples after the run."""
        if self.refresh is not None:
            self.refresh.close(self.settings.generation_timeout_s)

    def on_exception(self, exception: BaseException) -> None:
        """A failed or interrupted fit skips ``teardown``: join the sampler here too."""
        self.teardown()

    def summary(self) -> dict[str, Any]:
        """The rollout side's counters for ``summary.json`` (training counts are this rank's)."""
        return {"sampler_refreshes": int(self.buffer.rounds), **self.sampler.summary(),
                "async_generation": self.settings.async_generation, **self.refresh.summary(),
                **self.producer.summary(), **self.validation_producer.summary("val_", ("completions", "unscorable")),
                "skipped_unscorable_rows": dict(self.skipped_rows), **self.rules.summary()}

    def state_dict(self) -> dict[str, Any]:
        """The parts' states and the buffer settings they were sampled under (under DDP/FSDP a collective)."""
        return with_rollout_ranks({
            "prompt_order": self.prompts.state_dict(), **self.buffer.state_dict(), **self.refresh.state_dict(),
            **self.sampler.state_dict(), "counters": dict(self.producer.counters),
            **self.rules.state_dict(), "settings": buffer_settings(self.cfg)})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into the parts (after ``setup``), as this rank resumes it
        (:func:`~grpolab.rollout.resume.resumable_state`: a buffer whose settings changed is refused or dropped)."""
        state, keep = resumable_state(state, self.cfg, *self._rank_world(), self.resume_drop_buffer)
        self.prompts.load_state_dict(state["prompt_order"])
        self.buffer.load_state_dict(state, keep_minibatches=keep)
        self.refresh.load_state_dict(state, keep_in_flight=keep)
        self.sampler.load_state_dict(state, default_pushes=state["rounds"])
        self.rules.load_state_dict(state)
        self.producer.counters.update(state.get("counters", {}))
