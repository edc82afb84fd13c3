"""How a rollout buffer is refilled: sampled now (:class:`SyncRefresh`) or ahead, in a background thread
(:class:`AsyncRefresh`). Both sit behind one interface that the data module drives:

* :meth:`SyncRefresh.refill` returns the k minibatches of the next refresh (round ``buffer.rounds``);
* :meth:`SyncRefresh.before_step` runs before every step, after any refill (async: launch the next buffer,
  set the thread split), at the points the buffer's :class:`~grpolab.rollout.schedule.Schedule` names;
* :meth:`SyncRefresh.rescore_reference` re-scores the minibatches still to be served once the module has
  refreshed its reference (``algo.ref_refresh_every``);
* :meth:`SyncRefresh.state_dict` / :meth:`SyncRefresh.load_state_dict` carry what a checkpoint needs
  (async: the buffer in flight, regenerated on resume from the saved sampler weights).

Each refresh samples with its own seed (:func:`round_seed`), so a resumed run samples exactly what the original
run sampled.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from grpolab.errors import NonFiniteLossError
from grpolab.rollout.background import BackgroundJob, RolloutEngineError, half_cores, split_cpu_threads
from grpolab.rollout.buffer import Minibatch, RolloutBuffer
from grpolab.rollout.producer import RolloutProducer
from grpolab.rollout.prompt_order import PromptOrder
from grpolab.rollout.sampler import SamplerPolicy
from grpolab.rollout.sampler_failure import SamplerFailure
from grpolab.rollout.settings import RolloutConfig

log = logging.getLogger(__name__)


def round_seed(seed: int, round_index: int, rank: int = 0, world: int = 1) -> int:
    """The sampling seed of refresh ``round_index`` on ``rank`` of ``world`` processes (distinct per rank)."""
    return (seed * 1_000_003 + round_index) * world + rank


class SyncRefresh:
    """Refill the buffer when it runs out: push the policy's weights, then sample the next refresh from them.

    Args:
        producer: generate -> verify -> advantages -> log-probs.
        sampler: the engine and the version of the weights it holds.
        models: a :class:`~grpolab.handle.PolicyHandle` (the live ``policy``, the ``reference`` and its version); read
            only.
        train_rows: the training split.
        prompts: the prompt order (shared by all ranks; each rank keeps its own slice).
        seed: the run's seed.
        rank, world: this process and the process count (groups never span ranks).
        precision: returns the training forward's precision context (bf16-mixed: autocast), so log alpha is
            computed as the training pass computes log-probs.
    """

    def __init__(self, producer: RolloutProducer, sampler: SamplerPolicy, models: Any, train_rows: list[dict],
                 prompts: PromptOrder, seed: int, rank: int = 0, world: int = 1,
                 precision: Callable[[], Any] = contextlib.nullcontext) -> None:
        self.producer = producer
        self.sampler = sampler
        self.models = models
        self.train_rows = train_rows
        self.prompts = prompts
        self.seed = seed
        self.rank, self.world = rank, world
        self.precision = precision
        self.rows_per_refresh = producer.cfg.steps_per_generation * producer.cfg.prompts_per_step
        self.time_rollout_s = 0.0  # time the trainer spent on rollouts (waiting for them, under async)
        self.time_generation_s = 0.0  # async: the background sampler's busy time (buffers handed over)

    def take_indices(self) -> list[int]:
        """The next refresh's training rows for this rank: every rank draws the same global order and keeps its
        own disjoint slice, so a group (one prompt x num_generations completions) never spans ranks."""
        n = self.rows_per_refresh
        return self.prompts.take(n * self.world)[self.rank * n:(self.rank + 1) * n]

    def seed_of(self, round_index: int) -> int:
        return round_seed(self.seed, round_index, self.rank, self.world)

    def refill(self, step: int, round_index: int) -> list[Minibatch]:
        """Sample refresh ``round_index`` with the policy of step ``step`` (which becomes the sampler alpha).

        A sampler that fails and can be restarted (:meth:`SamplerPolicy.restart`: a vLLM server this run started,
        ``rollout.server.max_restarts``) is restarted and the refresh sampled again after putting back what the
        failed attempt advanced: the same prompts, the same seed, the weights of the same policy (the live policy of
        step ``step``, which does not change while the trainer waits here), pushed to the new sampler. The buffer is
        then the one the failed attempt would have produced, up to the sampler's own non-determinism (a vLLM
        server's batching may round differently); the counters count it once, ``weight_syncs`` counts the re-push.

        Raises:
            NonFiniteLossError: the policy's probabilities are not finite (sampling cannot proceed).
            SamplerFailure: the push or the sampler failed and no restart is left (the prompt order and counters are
                put back first).
        """
        start = time.perf_counter()
        before = (self.prompts.state_dict(), dict(self.producer.counters))  # put back if the sampler fails
        while True:
            rows = [self.train_rows[i] for i in self.take_indices()]
            torch.manual_seed(self.seed_of(round_index))
            try:
                self.sampler.push(self.models.policy, step)
                with self.precision():
                    minibatches = self.producer.produce(self.sampler.module(self.models.policy),
                                                        self.models.reference, rows, round_index, step,
                                                        reference_version=self.models.reference_version)
                break
            except Exception as err:
                self.prompts.load_state_dict(before[0])
                self.producer.counters.clear()
                self.producer.counters.update(before[1])
                self._restart_or_raise(step, err)
        self.time_rollout_s += time.perf_counter() - start
        return minibatches

    def _restart_or_raise(self, step: int, err: BaseException, cause: BaseException | None = None) -> None:
        """Restart the sampler that failed with ``err`` (``cause``: the underlying error, default ``err``) and
        return, or raise.

        Raises:
            NonFiniteLossError: the error is torch's for non-finite sampling probabilities.
            SamplerFailure: the sampler is not restarted (its reason leads with the engine's note on why not).
        """
        cause = err if cause is None else cause
        # torch's sampling error names `inf`/`nan` as words; a server's message may hold "/inference/..."
        if isinstance(cause, RuntimeError) and re.search(r"\b(inf|nan)\b", str(cause)):
            raise NonFiniteLossError(f"step {step}: sampling failed, the policy's probabilities are non-finite "
                                     f"({cause}); lower algo.learning_rate") from err
        if not self.sampler.restart(cause):
            raise SamplerFailure(step, err, self.sampler.engine.restart_note(cause)) from err

    def _push(self, step: int, push: Callable[[], None]) -> None:
        """``push()`` (a weight push), restarting the sampler and pushing again when it fails and can be restarted.

        Raises:
            As :meth:`_restart_or_raise`.
        """
        while True:
            try:
                return push()
            except Exception as err:
                self._restart_or_raise(step, err)

    def rescore_reference(self, minibatches: list[Minibatch]) -> None:
        """Re-score ``ref_logp`` of the minibatches that an older reference scored, with the reference the module
        holds now (it refreshes it every ``algo.ref_refresh_every`` steps): the KL term of every later step is then
        taken against the new reference, whatever k. One no-grad forward each; refreshes are rare."""
        version = self.models.reference_version
        stale = [mb for mb in minibatches if mb.ref_logp is not None and mb.reference_version != version]
        if stale:
            with self.precision():
                self.producer.add_reference_logp(stale, self.models.reference, version)

    def before_step(self, step: int, buffer: RolloutBuffer, max_steps: int | None) -> None:
        """Work due before each step once the buffer is filled; nothing for a synchronous refresh."""

    def summary(self) -> dict[str, float]:
        """``time_generation_s`` and ``time_rollout_s`` for ``summary.json``."""
        return {"time_generation_s": round(self.time_generation_s, 2), "time_rollout_s": round(self.time_rollout_s, 2)}

    def state_dict(self) -> dict[str, Any]:
        """``time_rollout_s``, ``time_generation_s`` and ``in_flight`` (the buffer being generated; None here)."""
        return {"time_rollout_s": self.time_rollout_s, "time_generation_s": self.time_generation_s,
                "in_flight": None}

    def load_state_dict(self, state: dict[str, Any], keep_in_flight: bool = True) -> None:
        """Restore :meth:`state_dict`; ``keep_in_flight=False`` drops a saved buffer in flight (its settings changed).

        Raises:
            ValueError: a buffer in flight is kept (only an asynchronous refresh has buffers in flight).
        """
        if keep_in_flight and state.get("in_flight") is not None:
            raise ValueError("this checkpoint was written with rollout.async_generation=true (a buffer was in "
                             "flight); resume it with the same setting")
        self.time_rollout_s = state.get("time_rollout_s", 0.0)
        self.time_generation_s = state.get("time_generation_s", 0.0)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop what the refresh started (nothing here)."""


class AsyncRefresh(SyncRefresh):
    """Generate buffer r+1 in a background thread, from the weights pushed at refresh r, while the trainer trains
    on buffer r (lag k*i .. 2k*i-1, or less with ``rollout.max_lag``).

    While the next buffer is generated (``rollout.overlap_steps`` steps after its launch) the trainer's and the
    sampler's threads get half the CPU cores each; from then on the trainer waits for that buffer if it is not done
    and takes every core. The schedule depends on the step alone, never on timing, so a run is reproducible bit
    for bit.

    Args:
        settings: the validated rollout settings (``generation_timeout_s``); the push delay and the overlap come
            from the buffer's :class:`~grpolab.rollout.schedule.Schedule`.
        Others: as :class:`SyncRefresh`.
    """

    def __init__(self, *args: Any, settings: RolloutConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.sampler.engine.keep_sampler_state()  # a checkpoint may hold a buffer in flight
        self._job: BackgroundJob | None = None  # the next buffer, in flight
        self._job_spec: dict[str, Any] | None = None  # its round, prompt indices and policy version
        self._restore: dict[str, Any] | None = None  # an in-flight spec from a checkpoint, regenerated on resume
        self._tokenizer: Any = None
        self._all_threads: int | None = None  # the trainer's torch threads before the first split

    def refill(self, step: int, round_index: int) -> list[Minibatch]:
        """Hand over the buffer generated in the background (launching it now, with every core, if none is in
        flight), then add the reference's log-probs as of this step.

        Raises:
            SamplerFailure: the background sampler failed with no restart left, or exceeded
                ``rollout.generation_timeout_s`` (:meth:`_result`).
        """
        start = time.perf_counter()
        self._resume_in_flight(step)
        if self._job is None:  # the first buffer (or no overlap: the push delay is a whole buffer)
            self._launch(step, round_index, overlap=False)
        minibatches, counters = self._result(step)
        # cleared only after the result: a job that failed or timed out is still joined at close()
        job, self._job, self._job_spec = self._job, None, None
        self.producer.add_counts(counters)
        self.time_generation_s += job.finished - job.started
        self.producer.add_reference_logp(minibatches, self.models.reference, self.models.reference_version)
        self.time_rollout_s += time.perf_counter() - start
        return minibatches

    def before_step(self, step: int, buffer: RolloutBuffer, max_steps: int | None) -> None:
        """Launch the next buffer once the push delay is reached, then set the trainer's threads for this step.

        The schedule says when (:meth:`~grpolab.rollout.schedule.Schedule.push_delay`) and whether the run needs
        a next buffer (:meth:`~grpolab.rollout.schedule.Schedule.next_buffer_needed`). If a refresh rule
        (``rollout.refresh``) ends the current buffer early, the buffer launched here is handed over early
        (:meth:`refill`), and the next launch takes the weights of that step.
        """
        self._resume_in_flight(step)
        schedule = buffer.schedule
        if (self._job is None and buffer.position >= schedule.push_delay()
                and schedule.next_buffer_needed(step, buffer.position, max_steps)):
            self._launch(step, buffer.rounds)
        self._balance_threads(step, buffer.position >= schedule.overlap_end())

    def _launch(self, step: int, round_index: int, overlap: bool = True) -> None:
        """Push the policy (version ``step``) and generate refresh ``round_index`` from it in the background.
        ``overlap=False``: the trainer waits for this buffer, so the sampler gets every core.

        Raises:
            SamplerFailure: the push failed with no restart left (nothing was launched, no prompt taken).
        """
        self._push(step, lambda: self.sampler.push(self.models.policy, step))
        self._start_job({"round": round_index, "indices": self.take_indices(),
                         "policy_version": self.sampler.version}, overlap)

    def _resume_in_flight(self, step: int) -> None:
        """After a resume: regenerate the buffer that was in flight from the saved sampler weights (kept in flight
        until the push succeeded, so a failure here saves it again)."""
        if self._restore is None:
            return
        spec = self._restore
        self._push(step, lambda: self.sampler.restore(spec, like=self.models.policy))
        self._restore = None
        self._start_job({k: v for k, v in spec.items() if k != "sampler_weights"})

    def _result(self, step: int) -> tuple[list[Minibatch], dict[str, int]]:
        """The buffer in flight, once delivered; after a failure that the sampler survives by a restart, the same
        buffer generated again.

        The buffer is regenerated from the weights its launch pushed (``engine.sampler_state_dict()``, read before
        the restart: the sampler policy of that refresh, not the live policy, which has trained since), with the
        same prompts, round and seed, every core to the sampler (the trainer waits for it). Identical to what the
        failed job would have delivered up to the sampler's own non-determinism (a vLLM server's batching);
        ``weight_syncs`` counts the reload, the counters count the buffer once.

        Raises:
            SamplerFailure: the job failed and the sampler is not restarted, or it did not deliver within
                ``rollout.generation_timeout_s`` (a job still running is never restarted). The job stays in flight,
                so ``last.ckpt`` saves it and a resume regenerates it.
            NonFiniteLossError: the job failed on non-finite sampling probabilities.
        """
        while True:
            try:
                return self._job.result(self.settings.generation_timeout_s, step)
            except RolloutEngineError as err:
                cause = err.__cause__ if self._job.done() and err.__cause__ is not None else err
                engine, spec = self.sampler.engine, self._job_spec
                weights = engine.sampler_state_dict() if engine.can_restart(cause) else None
                self._restart_or_raise(step, err, cause)  # returns after a restart
                state = {"sampler_weights": weights, "policy_version": spec["policy_version"]}
                self._push(step, functools.partial(self.sampler.restore, state, like=self.models.policy, count=True))
                self._start_job(spec, overlap=False)

    def _balance_threads(self, step: int, overlap_ended: bool) -> None:
        if self._all_threads is None:
            return
        pending = self._job is not None
        if pending and overlap_ended:
            start = time.perf_counter()
            self._result(step)  # raises SamplerFailure, naming the step
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
        rows = [self.train_rows[i] for i in spec["indices"]]
        policy = self.sampler.module(self.models.policy)
        # Its own generator, on the sampler's device: the trainer uses torch's global RNG at the same time.
        device = next(policy.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self.seed_of(spec["round"]))
        # Its own counters, added when the buffer is handed over: a buffer regenerated after a resume counts once.
        producer = self.producer.with_engine(self.sampler.engine, own_counters=True)
        if self._tokenizer is None:  # its own tokenizer: a fast tokenizer is not safe to share across threads
            self._tokenizer = copy.deepcopy(self.producer.tokenizer)
        producer.tokenizer = self._tokenizer
        # autocast is per thread: the sampler samples (and takes log alpha) under the training forward's precision
        precision = self.precision()

        def produce() -> tuple[list[Minibatch], dict[str, int]]:
            # the current CUDA device is per thread: a new thread would start on cuda:0 whatever the rank
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(), precision:
                return producer.produce(policy, None, rows, spec["round"], spec["policy_version"], generator), \
                    producer.counters

        self._job_spec = spec
        self._job = BackgroundJob(produce, f"rollout buffer {spec['round']}")

    def state_dict(self) -> dict[str, Any]:
        """Counters, and the buffer in flight: what regenerates it on resume (prompts, round, weights)."""
        spec = self._job_spec or self._restore
        in_flight = None
        if spec is not None:
            weights = self._restore["sampler_weights"] if self._restore else self.sampler.engine.sampler_state_dict()
            in_flight = {**spec, "sampler_weights": weights}
        return {**super().state_dict(), "in_flight": in_flight}

    def load_state_dict(self, state: dict[str, Any], keep_in_flight: bool = True) -> None:
        """Restore :meth:`state_dict`; a buffer in flight is regenerated before the next step (unless
        ``keep_in_flight=False``: its settings changed, it is dropped)."""
        self.time_rollout_s = state.get("time_rollout_s", 0.0)
        self.time_generation_s = state.get("time_generation_s", 0.0)
        self._restore = state.get("in_flight") if keep_in_flight else None

    def close(self, timeout_s: float | None = None) -> None:
        """Join a buffer still in flight (bounded by ``timeout_s``), so no thread samples after the run, and give
        the trainer back the threads it had before the first split.

        A job that is still running after the wait is reported as an error in the log: its thread is a daemon,
        so it cannot keep the process alive, but it may still be sampling.
        """
        if self._job is not None:
            self._job.wait_quietly(timeout_s)
            if not self._job.done():
                log.error("the background sampler producing %s did not stop within %s s; its daemon thread ends "
                          "with the process", self._job.name, timeout_s)
            else:
                self._job = None
        if self._all_threads is not None and torch.get_num_threads() != self._all_threads:
            torch.set_num_threads(self._all_threads)


def make_refresh(settings: RolloutConfig, *args: Any) -> SyncRefresh:
    """The refresh strategy ``settings`` ask for (:class:`AsyncRefresh` with ``rollout.async_generation``), built
    with :class:`SyncRefresh`'s arguments."""
    return AsyncRefresh(*args, settings=settings) if settings.async_generation else SyncRefresh(*args)
