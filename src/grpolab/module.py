"""GRPOModule: the policy, a frozen reference model, and one GRPO optimizer step per training batch.

Manual optimization keeps the step exact: the loss of a step is split into micro-batches that share one
denominator (so the result does not depend on the split), non-finite losses and gradients stop training
*before* the optimizer touches the weights, and gradient clipping sees the whole step's gradient.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from grpolab.algo.advantages import group_reward_summary
from grpolab.algo.aggregation import step_denominator
from grpolab.algo.diagnostics import (
    c_weight,
    drift_sum,
    policy_sampler_divergence,
    surrogate,
    weight_quantiles,
)
from grpolab.algo.kl import masked_mean
from grpolab.algo.losses import grpo_loss, loss_stats_to_metrics, merge_loss_stats
from grpolab.algo.metric_reduction import step_weights
from grpolab.algo.sampling_correction import first_use_mismatch, truncated_importance_weights
from grpolab.callbacks.step_logging import log_step_metrics, log_validation_metrics
from grpolab.checkpoint import frozen_weights
from grpolab.checkpoint.rank_state import own_rank_state, rank_lists
from grpolab.config import GRPOConfig
from grpolab.config_checks import FP16_SCALER_MESSAGE
from grpolab.distributed import is_sharded, shard_models
from grpolab.errors import ConfigError, NonFiniteLossError
from grpolab.forward.logprob_pass import completion_log_probs
from grpolab.forward.theorem1 import lower_bound_metrics
from grpolab.handle import PolicyHandle, ServedBatch
from grpolab.models import make_reference
from grpolab.previous_policy import PreviousPolicy
from grpolab.reference_refresh import ReferenceRefresh
from grpolab.rollout.buffer import Minibatch
from grpolab.run_clock import RunClock

log = logging.getLogger(__name__)

# Consecutive steps in which every group has zero reward variance before the run warns that it is not
# learning (a collapsed policy never recovers on its own: docs/guide/pitfalls.md #15).
ZERO_VARIANCE_PATIENCE = 20


class GRPOModule(L.LightningModule):
    """Policy + frozen reference (only when ``beta > 0``; refreshed here, ``algo.ref_refresh_every``) trained with the
    GRPO objective.

    Args:
        model: a model spec from ``conf/model`` (``load_tokenizer()``, ``load_policy(task)``).
        cfg: validated :class:`~grpolab.config.GRPOConfig`.
        optimizer: partial ``(params) -> torch.optim.Optimizer`` (Hydra ``_partial_``).
        lr_scheduler: partial ``(optimizer, ...) -> LRScheduler`` or None; ``num_training_steps`` is filled
            in from ``trainer.max_steps`` when the schedule takes it.
        task: passed to ``model.load_policy`` (the tiny model warm-starts on it).
        tokenizer: the policy's tokenizer; None = ``model.load_tokenizer()`` on first use.

    Attributes:
        models: the :class:`~grpolab.handle.PolicyHandle` the data module reads; only the module writes it.
    """

    def __init__(self, model: Any, cfg: GRPOConfig, optimizer: Callable[..., torch.optim.Optimizer],
                 lr_scheduler: Callable[..., Any] | None = None, task: Any | None = None,
                 tokenizer: Any | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model_spec = model
        self.cfg = cfg
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.task = task
        self.policy: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.models = PolicyHandle()
        self._tokenizer = tokenizer
        self._anchors: dict[tuple[int, int], torch.Tensor] = {}
        self.val_history: list[dict[str, float]] = []
        self.time_train_s = 0.0
        self.num_tokens = 0
        self._val_acc: dict[str, float] = {}
        self.clock = RunClock()  # train/time/elapsed and time_total_s, going on across resumes (the checkpoint's)
        self._zero_variance_streak = 0
        self._lag_max = 0
        self.skipped_steps = 0  # algo.skip_zero_grad_steps: optimizer steps left out (summary.json)
        self._frozen = frozen_weights.CheckpointPlan(bool(cfg.ref_refresh_every))  # what checkpoints leave out
        self._mismatch: dict[str, float] = {}  # engine vs trainer log-probs of the last step (rollout=vllm)
        self._previous: PreviousPolicy | None = None  # pi_{t-1}'s weights (algo.ratio_reference=previous)
        self._ref_refresh = ReferenceRefresh(cfg.ref_refresh_every)  # when the reference becomes the policy

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self.model_spec.load_tokenizer()
        return self._tokenizer

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = self.model_spec.load_policy(self.task)
        self.policy.train()
        if self.cfg.beta > 0:  # with beta = 0 no reference model is loaded at all
            self.reference = make_reference(self.policy)
        if self._device_mesh is not None:  # trainer=fsdp (Lightning ModelParallelStrategy): FSDP2 shards
            shard_models(self.policy, self.reference, self._device_mesh)
        self.models.policy, self.models.reference = self.policy, self.reference
        if self.cfg.ratio_reference == "previous":
            self._previous = PreviousPolicy(self.policy)

    def configure_optimizers(self) -> Any:
        opt = self.optimizer_factory(params=[p for p in self.policy.parameters() if p.requires_grad])
        if self.scheduler_factory is None:
            return opt
        kwargs = {}
        params = inspect.signature(getattr(self.scheduler_factory, "func", self.scheduler_factory)).parameters
        if "num_training_steps" in params:
            kwargs["num_training_steps"] = max(int(self.trainer.max_steps), 1)
        sched = self.scheduler_factory(optimizer=opt, **kwargs)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -------------------------------------------------------------------------------------- training
    def on_fit_start(self) -> None:
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:  # fp16 loss scaling, however given
            raise ConfigError(f"a precision plugin with a GradScaler (trainer.precision=16-mixed) {FP16_SCALER_MESSAGE}")
        self.clock.start_fit()

    def on_train_start(self) -> None:  # also a resumed checkpoint that was saved before a refresh that was due
        self._refresh_reference()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not 0 <= self.trainer.max_steps <= self.global_step:  # another step follows (max_steps -1: no limit)
            self._refresh_reference()  # after this step's checkpoints, before the next step's minibatch is made

    def _refresh_reference(self) -> None:
        """``algo.ref_refresh_every``: the reference becomes the policy when due; its version goes on the handle."""
        self.models.reference_version = self._ref_refresh.refresh_if_due(self.reference, self.policy, self.global_step)

    def _anchor(self, mb: Minibatch, start: int, stop: int, current: torch.Tensor) -> torch.Tensor:
        """log pi_k: the policy at the first use of this minibatch (frozen for its later iterations)."""
        if mb.iteration == 0:
            return current
        return self._anchors[(mb.round, mb.index)][start:stop].to(current.device)

    def training_step(self, mb: Minibatch, batch_idx: int) -> torch.Tensor:
        t0 = time.perf_counter()
        c, step = self.cfg, self.global_step
        self._ref_refresh.check(mb, step)  # its ref_logp were scored by the reference the module holds now
        opt = self.optimizers()
        n = len(mb)
        size = c.micro_batch_size or n
        # TRL's normalisation under DDP's gradient averaging (dapo: global token mean; others: per rank).
        denominator = step_denominator(mb.loss_mask, c.loss_type, c.max_completion_length, self.trainer.world_size,
                                       self._sum_over_ranks)
        stats, current, entropies, total = [], [], [], 0.0
        for s in range(0, n, size):
            rows = mb.rows(s, s + size)
            rows = {k: (None if v is None else v.to(self.device)) for k, v in rows.items()}
            logp, entropy = completion_log_probs(self.policy, rows["prompt_ids"], rows["prompt_mask"],
                                                 rows["completion_ids"], rows["completion_mask"], c.temperature,
                                                 with_entropy=True, shared_prompt=c.shared_prompt_forward)
            cur = logp.detach()
            sampler = rows["sampler_logp"] if rows["sampler_logp"] is not None else cur
            anchor = self._anchor(mb, s, s + size, cur)
            previous = None  # log pi_{t-1} (algo.ratio_reference=previous): one no-grad forward, same rows
            if self._previous is not None:
                with torch.no_grad(), self._previous.swapped_in(self.policy):
                    previous = completion_log_probs(self.policy, rows["prompt_ids"], rows["prompt_mask"],
                                                    rows["completion_ids"], rows["completion_mask"], c.temperature,
                                                    shared_prompt=c.shared_prompt_forward)[0]
            weights = None
            if c.vllm_importance_sampling_correction and rows["engine_logp"] is not None:  # TRL's truncated IS
                weights = truncated_importance_weights(sampler, rows["engine_logp"], c.vllm_importance_sampling_cap)
            loss, st = grpo_loss(logp, sampler, anchor, rows["advantages"], rows["loss_mask"], c,
                                 denominator, rows["ref_logp"], token_weights=weights, lag=mb.lag,
                                 previous_logp=previous)
            if not torch.isfinite(loss):
                raise NonFiniteLossError(f"step {step}: loss is {loss.item()} in micro-batch starting at row {s} "
                                         f"(ratio max {float(st.get('ratio_max', math.nan))}, "
                                         f"kl sum {float(st.get('kl_sum', 0))})")
            with self._no_sync(last=s + size >= n):  # all-reduce gradients once, after the last micro-batch
                self.manual_backward(loss)
            total += float(loss.detach())
            stats.append(st)
            current.append(cur)
            entropies.append(entropy)
        if mb.iteration == 0 and c.num_iterations > 1:
            self._anchors = {(mb.round, mb.index): torch.cat(current).cpu()}
        self._mismatch = first_use_mismatch(mb, torch.cat(current), step, c)
        grad_norm = self._clip_and_check(step)
        # algo.skip_zero_grad_steps: the global norm decides, so every rank takes the same branch. The grads are set
        # to None and opt.step() still runs: AdamW leaves a parameter without a gradient alone (no momentum step, no
        # weight decay), while Lightning counts the step in global_step, so the k schedule is unchanged.
        if c.skip_zero_grad_steps and grad_norm == 0.0:
            opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
        if self._previous is not None:  # these weights are pi_{t-1} of the next step
            self._previous.snapshot(self.policy)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self._check_weights(step)
        bound = lower_bound_metrics(self.policy, mb, torch.cat(current), c, step)  # Theorem 1 at pi_{k+1}
        sched = self.lr_schedulers()
        if sched is not None:
            sched.step()
        self.time_train_s += time.perf_counter() - t0
        self._log_step(mb, total, stats, torch.cat(current), torch.cat(entropies), grad_norm, t0, bound, step)
        return torch.tensor(total)

    def _sum_over_ranks(self, x: float) -> float:
        return float(self.trainer.strategy.reduce(torch.tensor(x, device=self.device), reduce_op="sum"))

    def _no_sync(self, last: bool) -> Any:
        block = getattr(self.trainer.strategy, "block_backward_sync", None)  # DDP's no_sync (Lightning)
        return contextlib.nullcontext() if last or block is None else block()

    def _clip_and_check(self, step: int) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else 0.0
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor
        if not math.isfinite(norm):
            raise NonFiniteLossError(f"step {step}: gradient norm is {norm}; the optimizer step was not taken")
        return norm

    def _check_weights(self, step: int) -> None:
        """Stop before a non-finite policy is checkpointed or sampled from (one fused norm, then names)."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.policy.parameters() if p.requires_grad]
        if not local or math.isfinite(float(torch.nn.utils.get_total_norm(local))):
            return  # a non-finite weight makes the norm non-finite; ~5x cheaper than one check per tensor
        bad = [n for n, p in self.policy.named_parameters()
               if p.requires_grad and not torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()]
        if bad:
            raise NonFiniteLossError(f"step {step}: policy weights are non-finite after the optimizer step "
                                     f"({len(bad)} tensors, e.g. {bad[0]}); lower algo.learning_rate")

    def _log_step(self, mb: Minibatch, loss: float, stats: list[dict], logp: torch.Tensor, entropy: torch.Tensor,
                  grad_norm: float, t0: float, bound: dict[str, float], step: int = 0) -> None:
        c = self.cfg
        self._lag_max = max(self._lag_max, mb.lag)
        mask = mb.loss_mask.to(logp.device).bool()
        valid = ~torch.isnan(mb.rewards)
        rewards = mb.rewards[valid]
        summary = group_reward_summary(mb.rewards, mb.group_ids, c.zero_std_threshold)
        num_groups = max(len(summary["mean"]), 1)
        lengths = mb.completion_mask.sum(1).float()
        self.num_tokens += int(mb.completion_mask.sum() + mb.prompt_mask.sum())
        m: dict[str, float] = {
            "loss": loss,
            "reward": float(rewards.mean()) if len(rewards) else 0.0,
            "reward_std": float(summary["std"].mean()),
            "frac_reward_zero_std": float(mb.zero_std.float().mean()),
            "frac_zero_std/all_correct": float(summary["all_correct"].float().sum()) / num_groups,
            "frac_zero_std/all_wrong": float(summary["all_wrong"].float().sum()) / num_groups,
            "frac_unscorable": float((~valid).float().mean()),
            "entropy": float(masked_mean(entropy, mb.completion_mask.to(entropy.device).float())),
            "completions/mean_length": float(lengths.mean()),
            "completions/clipped_ratio": float(mb.truncated.float().mean()),
            "num_tokens": float(self.num_tokens),
            "grad_norm": grad_norm,
            "skipped_steps": float(self.skipped_steps),  # algo.skip_zero_grad_steps: steps left out so far
            "learning_rate": float(self.optimizers().param_groups[0]["lr"]),
            "lag": float(mb.lag),  # optimizer steps since the weights that sampled mb (exact, also async)
            "lag/max": float(self._lag_max),  # the largest lag so far in the run
            "iteration": float(mb.iteration),
            "sampler_refreshes": float(mb.round + 1),
        }
        self._zero_variance_streak = self._zero_variance_streak + 1 if bool(mb.zero_std.all()) else 0
        if self._zero_variance_streak == ZERO_VARIANCE_PATIENCE:
            log.warning("step %d: every group has had zero reward variance for %d steps, so there is no learning "
                        "signal (all wrong: %.2f, all correct: %.2f of the last batch's groups). If this follows a "
                        "high algo.learning_rate the policy has collapsed and will not recover.", self.global_step,
                        ZERO_VARIANCE_PATIENCE, m["frac_zero_std/all_wrong"], m["frac_zero_std/all_correct"])
        counts = {}  # rows each reward function scored (its mean's weight across ranks)
        for name, values in mb.info.get("per_func", {}).items():
            vals = [v for v in values if v is not None]
            m[f"rewards/{name}/mean"] = sum(vals) / len(vals) if vals else 0.0
            counts[f"train/rewards/{name}/mean"] = float(len(vals))
        merged = merge_loss_stats(stats)
        m.update(loss_stats_to_metrics(merged))
        m.update(self._mismatch)
        # Paper diagnostics (docs/guide/objective.md#diagnostics): policy vs sampler, c(x), surrogate at pi = pi_k; Theorem 1 at pi_{k+1}.
        sampler = mb.sampler_logp.to(logp.device) if mb.sampler_logp is not None else logp
        div = policy_sampler_divergence(logp, sampler, mask)
        m.update({k: float(v) for k, v in div.items() if k != "num_sequences"})
        if mb.iteration == 0:  # read by the refresh rules before the next step (over completion tokens)
            self.models.drift = drift_sum(logp, sampler, mb.completion_mask.to(logp.device))
            self.models.served = ServedBatch.measure(logp, sampler, mb.completion_mask, mb.rewards)
        m.update({f"ratio/anchor_{k}": float(v) for k, v in weight_quantiles(logp, sampler, mask).items()})
        seq_mask = mask.any(1)
        cw = c_weight(mb.info["group_std"].to(logp.device), c.advantage_epsilon)
        unmasked = seq_mask & ~mb.zero_std.to(logp.device)
        m["c_weight/mean"] = float(cw.mean())
        m["c_weight/max"] = float(cw.max())
        m["c_weight/unmasked_mean"] = float(cw[unmasked].mean()) if unmasked.any() else 0.0
        delta = ((logp - sampler) * mask).sum(1)
        sur = surrogate(delta, mb.advantages.to(logp.device), seq_mask)
        m["surrogate"] = float(sur)
        m.update(bound)  # train/lower_bound etc., every algo.lower_bound_every steps
        now = time.perf_counter()
        m["step_time"] = now - t0
        m["time/train"] = self.time_train_s
        m.update(mb.metrics)  # the data module's own timings (time/rollout, time/weight_sync)
        m["time/elapsed"] = self.clock.elapsed(now)  # the whole run's: a resume goes on from its checkpoint's
        m["tokens_per_second"] = self.num_tokens / max(m["time/elapsed"], 1e-9)
        weights = None
        if self.trainer.world_size > 1:  # what this rank's means are over, to combine the ranks' values
            weights = {**step_weights(mb.completion_mask, mb.loss_mask, mb.rewards, mb.group_ids, mb.zero_std,
                                      merged.get("grad_weight_sum")), **counts}
        # not log_dict: ~10 ms a step; `step` (global_step before opt.step()) is the index log_dict would use
        log_step_metrics(self.trainer, {f"train/{k}": v for k, v in m.items()}, step, weights)

    # ------------------------------------------------------------------------------------ validation
    def on_validation_epoch_start(self) -> None:
        self._val_sums = {"correct": 0.0, "n": 0, "greedy_correct": 0.0, "greedy_n": 0, "length": 0.0,
                          "truncated": 0.0, "unscorable": 0}
        self._rng_state = torch.get_rng_state()
        torch.manual_seed(12345 + self.global_step)  # same held-out samples for the same step, any run

    def validation_step(self, samples: dict[str, dict[str, Any]], batch_idx: int) -> None:
        """Accumulate held-out accuracy from the data module's ``sampled`` and ``greedy`` samples (each with
        ``rewards`` [N] float, NaN = unscorable, and its ``generation``)."""
        sums = self._val_sums
        for greedy, s in ((False, samples["sampled"]), (True, samples["greedy"])):
            r = s["rewards"]
            ok = ~torch.isnan(r)
            sums["unscorable"] += int((~ok).sum())
            if greedy:
                sums["greedy_correct"] += float(r[ok].sum())
                sums["greedy_n"] += int(ok.sum())
            else:
                sums["correct"] += float(r[ok].sum())
                sums["n"] += int(ok.sum())
                sums["length"] += float(s["generation"].completion_mask.sum())
                sums["truncated"] += float(s["generation"].truncated.sum())

    def on_validation_epoch_end(self) -> None:
        torch.set_rng_state(self._rng_state)
        s = self._val_sums
        n_samples = max(s["n"] + (s["unscorable"] if s["n"] == 0 else 0), 1)
        acc = {
            "accuracy": s["correct"] / max(s["n"], 1),
            "greedy_accuracy": s["greedy_correct"] / max(s["greedy_n"], 1),
            "mean_length": s["length"] / n_samples,
            "truncated_ratio": s["truncated"] / n_samples,
            "num_unscorable": float(s["unscorable"]),
        }
        self._val_acc = acc
        val = {f"val/{k}": v for k, v in acc.items()}
        # callbacks read these (checkpoint monitor, progress bar); the logger row is written below at the steps
        # done, summary.json's numbering (Lightning would write it one step earlier inside fit)
        self.log_dict(val, on_step=False, on_epoch=True, sync_dist=True, logger=False)
        if not self.trainer.sanity_checking:
            self.val_history.append({"step": int(self.global_step), **acc})
            log_validation_metrics(self.trainer, val, int(self.global_step))

    # ------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        served = None if self.models.served is None else self.models.served.to_dict()
        own = {"anchors": self._anchors, "num_tokens": self.num_tokens, "drift": self.models.drift,
               "served": served}  # per rank (DDP)
        checkpoint["grpolab"] = {**own, **rank_lists(own), "val_history": self.val_history,
                                 **self._ref_refresh.state_dict(), "time_train_s": self.time_train_s,
                                 **self.clock.state_dict(),
                                 "lag_max": self._lag_max, "skipped_steps": self.skipped_steps,
                                 "previous_policy": None if self._previous is None else self._previous.state_dict()}
        record = {} if is_sharded(self.policy) else self._frozen.for_save(self.state_dict(keep_vars=True))
        if record:  # the frozen reference / LoRA base: rebuilt from the config at resume (grpolab.checkpoint.frozen_weights)
            frozen_weights.strip(checkpoint["state_dict"], record)
            checkpoint["grpolab"][frozen_weights.RECORD_KEY] = record

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("grpolab", {})
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
        self._anchors, self.num_tokens, self.models.drift, served = own_rank_state(state, rank, world)  # own (DDP)
        self.models.served = ServedBatch.from_dict(served)
        self._ref_refresh.load_state_dict(state, int(checkpoint.get("global_step", 0)))
        self.val_history, self.time_train_s = state.get("val_history", []), state.get("time_train_s", 0.0)
        self.clock.load_state_dict(state)
        self._lag_max, self.skipped_steps = state.get("lag_max", 0), state.get("skipped_steps", 0)
        if self._previous is not None and state.get("previous_policy") is not None:
            self._previous.load_state_dict(state["previous_policy"], self.policy)
        record = state.get(frozen_weights.RECORD_KEY)
        if self.policy is None or is_sharded(self.policy):
            return  # FSDP: sharded state dicts, nothing left out
        trainer = self._trainer  # a checkpoint without its frozen tensors: rebuilt, checked, put back (strict load)
        source = str(trainer.ckpt_path) if trainer is not None and trainer.ckpt_path else "the checkpoint"
        self._frozen.after_load(checkpoint["state_dict"], self.state_dict(keep_vars=True), record, source)
