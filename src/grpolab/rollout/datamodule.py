"""RolloutDataModule: rollout buffers refreshed every ``steps_per_generation`` optimizer steps.

The training dataloader yields lightweight tickets; the real minibatch is produced in
``on_before_batch_transfer``, which Lightning calls right before each training step, after the previous
optimizer step. (Lightning's fetcher reads one batch ahead, so sampling inside the dataset iterator would
use the policy from one step too early.) Every ``steps_per_generation`` steps the *current* policy samples
a buffer of ``steps_per_generation`` minibatches with fresh prompts; minibatch ``j`` is trained on at lag
``j``, which is exactly sampling from alpha = pi_{k - lag} (paper.md §2.1, design.md §1), and each
minibatch serves ``num_iterations`` consecutive steps.

Every sampler refresh pushes the policy's weights to the engine (``engine.sync_weights``), counted in
``weight_syncs`` and timed. With ``rollout.async_generation`` the next buffer is generated in a background
thread from the weights pushed at the current refresh while the trainer trains on the current buffer
(lag k..2k-1; :mod:`grpolab.rollout.background`); each minibatch records the policy version that sampled it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from grpolab.config import GRPOConfig
from grpolab.errors import NonFiniteLossError
from grpolab.rollout.background import BackgroundJob, half_cores, split_cpu_threads
from grpolab.rollout.buffer import Minibatch, PromptSampler
from grpolab.rollout.engine import GenerationEngine
from grpolab.rollout.producer import RolloutProducer
from grpolab.rollout.resume import (buffer_settings, changed_buffer_settings, gather_rank_states, has_pending_rows,
                                    rank_state, saved_world_size)
from grpolab.rollout.settings import RolloutSettings

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
        rollout: :class:`~grpolab.rollout.settings.RolloutSettings` (async generation, max lag, timeout).
        resume_drop_buffer: on resume with settings that shape the rollout buffer changed (see
            :data:`BUFFER_SETTINGS`), drop the saved buffer and sample a new one instead of refusing.

    Call :meth:`connect` with the :class:`~grpolab.module.GRPOModule` before ``trainer.fit``.
    """

    def __init__(self, task: Any, reward_model: Any, engine: GenerationEngine, cfg: GRPOConfig, seed: int = 0,
                 val_batch_size: int = 64, rollout: RolloutSettings | None = None,
                 resume_drop_buffer: bool = False) -> None:
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
        self.settings = (rollout or RolloutSettings()).validate(cfg, getattr(engine, "owns_weights", False), engine)
        self.weight_syncs = 0  # engine.sync_weights calls
        self.time_weight_sync_s = 0.0
        self.time_generation_s = 0.0  # async: the background sampler's busy time (buffers handed over)
        self.sampler_version: int | None = None  # the optimizer step whose weights the sampler holds
        self._sync_time_step = 0.0  # push time in the coming step (read by the module's step log)
        self._pending: BackgroundJob | None = None  # async: the next buffer, in flight
        self._pending_spec: dict[str, Any] | None = None  # round, prompt indices and policy version
        self._restore: dict[str, Any] | None = None  # async: an in-flight spec from a checkpoint
        self._bg_tokenizer: Any = None
        self._all_threads: int | None = None  # async: torch threads of the trainer before the first split

    def connect(self, module: Any) -> None:
        """Attach the module that owns the live policy (its ``policy``, ``reference``, ``tokenizer``)."""
        self.module = module
        self.producer = RolloutProducer(self.cfg, self.task, module.tokenizer, self.engine, self.reward_model)
        self.producer.needs_sampler_logp = self.cfg.reuses_samples or self.settings.async_generation
        # Held-out accuracy is measured on the live policy, also when the sampler owns a (stale) copy.
        val_engine = getattr(self.engine, "validation_engine", None)
        module.producer = self.producer.with_engine(val_engine()) if val_engine else self.producer

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
        if self._restore is not None:
            self._relaunch()
        if self.position >= self.steps_per_buffer or not self.buffer:
            self.refresh()
        if self.settings.async_generation and self._pending is None \
                and self.position >= self.settings.push_delay(self.steps_per_buffer) and self._next_buffer_needed():
            self._launch(self._step())
        self._balance_threads()
        mb = self.buffer[self.position // self.cfg.num_iterations]
        mb.iteration = self.position % self.cfg.num_iterations
        lag = self._step() - mb.policy_version
        if self.settings.max_lag is not None and lag > self.settings.max_lag:  # refuse, never train on it
            raise RuntimeError(f"step {self._step()}: minibatch sampled at policy version {mb.policy_version} has "
                               f"lag {lag} > rollout.max_lag={self.settings.max_lag}")
        self.position += 1
        return mb

    def pop_weight_sync_time(self) -> float:
        """Seconds spent pushing weights to the sampler for the coming step (0 if none); resets it."""
        t, self._sync_time_step = self._sync_time_step, 0.0
        return t

    def _step(self) -> int:
        return int(self.module.global_step) if self.module._trainer is not None else 0

    def _push_weights(self, step: int) -> None:
        """engine.sync_weights(policy), counted and timed; skipped when the sampler already holds this step."""
        if self.sampler_version == step and self.weight_syncs > 0:
            return
        start = time.perf_counter()
        self.engine.sync_weights(self.module.policy)
        took = time.perf_counter() - start
        self.weight_syncs += 1
        self.time_weight_sync_s += took
        self._sync_time_step += took
        self.sampler_version = step

    def _sampler_policy(self) -> Any:
        """The module whose weights the sampler holds (for the sampler log-probs log alpha)."""
        own = getattr(self.engine, "sampler_model", None)
        return own if own is not None else self.module.policy

    def _precision(self) -> Any:
        """The training forward's precision context (bf16-mixed: autocast), so the lag-0 ratio is exactly 1."""
        trainer = getattr(self.module, "_trainer", None)
        return trainer.precision_plugin.forward_context() if trainer is not None else contextlib.nullcontext()

    def _take_rows(self) -> list[int]:
        n = self.cfg.steps_per_generation * self.cfg.prompts_per_step
        # Under DDP every rank draws the same global order and keeps its own disjoint slice; a group
        # (one prompt x num_generations completions) never spans ranks.
        rank, world = self._rank_world()
        return self.sampler.take(n * world)[rank * n:(rank + 1) * n]

    def _round_seed(self, round_index: int) -> int:
        # Each refresh has its own seed, so a resumed run samples exactly what the original run sampled.
        rank, world = self._rank_world()
        return (self.seed * 1_000_003 + round_index) * world + rank

    def refresh(self) -> None:
        """Start training on a new buffer: sampled now by the current policy (the sampler alpha becomes
        pi_k), or, with async generation, the one the background sampler made from the previous push."""
        if self.settings.async_generation:
            return self._refresh_async()
        start = time.perf_counter()
        train = self.task.splits()["train"]
        rows = [train[i] for i in self._take_rows()]
        torch.manual_seed(self._round_seed(self.rounds))
        step = self._step()
        self._push_weights(step)
        try:
            with self._precision():
                self.buffer = self.producer.produce(self._sampler_policy(), self.module.reference, rows,
                                                    self.rounds, step)
        except RuntimeError as err:
            if "inf" in str(err) or "nan" in str(err):
                raise NonFiniteLossError(f"step {step}: sampling failed, the policy's probabilities are non-finite "
                                         f"({err}); lower algo.learning_rate") from err
            raise
        self.rounds += 1
        self.position = 0
        self.time_rollout_s += time.perf_counter() - start

    # ------------------------------------------------------------------------------ async generation
    def _next_buffer_needed(self) -> bool:
        """False when the next buffer would start at or after ``trainer.max_steps`` (no wasted sampling)."""
        max_steps = getattr(self.module.trainer, "max_steps", -1) if self.module._trainer is not None else -1
        return max_steps is None or max_steps < 0 or self.rounds * self.steps_per_buffer < max_steps

    def _launch(self, step: int, overlap: bool = True) -> None:
        """Push the policy (version ``step``) and generate buffer ``rounds`` from it in the background.
        ``overlap=False``: the trainer waits for this buffer, so the sampler gets every core."""
        self._push_weights(step)
        self._start_job({"round": self.rounds, "indices": self._take_rows(), "policy_version": self.sampler_version},
                        overlap)

    def _balance_threads(self) -> None:
        """Async: the trainer's torch threads for the coming step. While the next buffer is generated (for
        ``rollout.overlap_steps`` steps after its launch) trainer and sampler threads get half the cores each;
        from then on the trainer waits for that buffer if it is not done and takes every core. The schedule
        depends on the step alone, never on timing, so the run is reproducible bit for bit."""
        if self._all_threads is None:
            return
        pending = self._pending is not None
        if pending and self.position >= self.settings.overlap_end(self.steps_per_buffer):
            start = time.perf_counter()
            self._pending.result(self.settings.generation_timeout_s, self._step())  # raises, naming the step
            self.time_rollout_s += time.perf_counter() - start
            pending = False
        want = min(half_cores(), self._all_threads) if pending else self._all_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def _start_job(self, spec: dict[str, Any], overlap: bool = True) -> None:
        if self._all_threads is None:
            self._all_threads = torch.get_num_threads()
        if overlap:  # trainer and sampler threads get half the cores each (the job takes the trainer's count)
            split_cpu_threads()
        elif torch.get_num_threads() != self._all_threads:
            torch.set_num_threads(self._all_threads)
        train = self.task.splits()["train"]
        rows = [train[i] for i in spec["indices"]]
        policy = self._sampler_policy()
        # Its own generator, on the sampler's device: the trainer uses torch's global RNG at the same time.
        device = next(policy.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self._round_seed(spec["round"]))
        # Its own counters, added when the buffer is handed over: a buffer regenerated after a resume counts once.
        producer = self.producer.with_engine(self.engine, own_counters=True)
        if self._bg_tokenizer is None:  # its own tokenizer: a fast tokenizer is not safe to share across threads
            self._bg_tokenizer = copy.deepcopy(self.module.tokenizer)
        producer.tokenizer = self._bg_tokenizer
        # autocast is per thread: the sampler samples (and takes log alpha) under the training forward's precision
        precision = self._precision()

        def produce() -> tuple[list[Minibatch], dict[str, int]]:
            # the current CUDA device is per thread: a new thread would start on cuda:0 whatever the rank
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(), precision:
                return producer.produce(policy, None, rows, spec["round"], spec["policy_version"], generator), \
                    producer.counters

        self._pending_spec = spec
        self._pending = BackgroundJob(produce, f"rollout buffer {spec['round']}")

    def _relaunch(self) -> None:
        """Resume: regenerate the buffer that was in flight at the checkpoint from the saved sampler weights."""
        spec, self._restore = self._restore, None
        self.engine.load_sampler_state_dict(spec.pop("sampler_weights"), like=self.module.policy)
        self.sampler_version = spec["policy_version"]
        self._start_job(spec)

    def _refresh_async(self) -> None:
        start = time.perf_counter()
        step = self._step()
        if self._pending is None:  # the first buffer (or no overlap: push delay = a whole buffer)
            self._launch(step, overlap=False)
        job, self._pending, self._pending_spec = self._pending, None, None
        self.buffer, counters = job.result(self.settings.generation_timeout_s, step)
        self.producer.add_counts(counters)
        self.time_generation_s += job.finished - job.started
        self.producer.add_reference_logp(self.buffer, self.module.reference)  # reference as of this step
        self.rounds += 1
        self.position = 0
        self.time_rollout_s += time.perf_counter() - start

    def teardown(self, stage: str | None = None) -> None:
        """Let a buffer still in flight finish (bounded by the timeout), so no thread samples after the run."""
        if self._pending is not None:
            self._pending.wait_quietly(self.settings.generation_timeout_s)
        if self._all_threads is not None and torch.get_num_threads() != self._all_threads:
            torch.set_num_threads(self._all_threads)  # the trainer's threads as they were before async split them

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self.module, "_trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    # ----------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The rollout state for exact resume. Under DDP/FSDP every rank holds its own buffer (disjoint prompts):
        they are gathered into ``ranks`` (one entry per rank, tensors on the CPU; see
        :func:`~grpolab.rollout.resume.gather_rank_states`), a collective: call it on every rank, as Lightning's
        ``Trainer.save_checkpoint`` does. The top level holds this rank's own entry (rank 0's in the file)."""
        local = {"buffer": [mb.to_dict() for mb in self.buffer], "in_flight": self._in_flight_state(),
                 "counters": dict(self.producer.counters) if self.producer else {}}
        state = {"sampler": self.sampler.state_dict() if self.sampler else None, **local,
                 "position": self.position, "rounds": self.rounds, "time_rollout_s": self.time_rollout_s,
                 "weight_syncs": self.weight_syncs, "time_weight_sync_s": self.time_weight_sync_s,
                 "time_generation_s": self.time_generation_s, "sampler_version": self.sampler_version,
                 "settings": buffer_settings(self.cfg)}
        rank, world = self._rank_world()
        if world > 1:
            state["ranks"] = gather_rank_states(local, rank, world)
        return state

    def _in_flight_state(self) -> dict[str, Any] | None:
        """The buffer being generated: what regenerates it on resume (prompts, round = RNG seed, weights)."""
        spec = self._pending_spec or self._restore
        if spec is None:
            return None
        weights = self._restore["sampler_weights"] if self._restore else self.engine.sampler_state_dict()
        return {**spec, "sampler_weights": weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sampler is None:
            self.sampler = PromptSampler(len(self.task.splits()["train"]), self.seed)
        if state.get("sampler"):
            self.sampler.load_state_dict(state["sampler"])
        changed = changed_buffer_settings(state.get("settings"), self.cfg)
        rank, world = self._rank_world()
        saved_world = saved_world_size(state)
        if saved_world != world and has_pending_rows(state):  # each rank held its own buffer
            changed = [*changed, f"rank buffers in the checkpoint: {saved_world}, processes now: {world}"]
        if changed and not self.resume_drop_buffer:
            raise ValueError(
                "resuming with settings that shape the saved rollout buffer changed: " + ", ".join(changed)
                + ". Resume with the checkpoint's values, or pass resume_drop_buffer=true to drop the saved buffer "
                "and sample a new one with the new settings"
            )
        if changed:
            log.warning("resume_drop_buffer=true: dropping the saved rollout buffer (%s); the next step samples "
                        "a new one", ", ".join(changed))
        if not changed and world > 1 and saved_world == world:
            state = {**state, **rank_state(state, rank)}  # this rank's own buffer (DDP: disjoint prompts)
        self.buffer = [] if changed else [Minibatch.from_dict(d) for d in state["buffer"]]
        self.position = 0 if changed else state["position"]
        self.rounds = state["rounds"]
        self.time_rollout_s = state.get("time_rollout_s", 0.0)
        self.weight_syncs = state.get("weight_syncs", self.rounds)
        self.time_weight_sync_s = state.get("time_weight_sync_s", 0.0)
        self.time_generation_s = state.get("time_generation_s", 0.0)
        self.sampler_version = state.get("sampler_version")
        self._restore = None if changed else state.get("in_flight")
        if self._restore is not None and not self.settings.async_generation:
            raise ValueError("this checkpoint was written with rollout.async_generation=true (a buffer was in "
                             "flight); resume it with the same setting")
        if self.producer is not None:
            self.producer.counters.update(state.get("counters", {}))
