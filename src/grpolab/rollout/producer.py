"""Produce a rollout buffer: prompts -> generate -> verify -> advantages -> (log-probs) -> minibatches.

No Lightning here: :class:`RolloutProducer` is called by the data module every ``steps_per_generation``
optimizer steps, and can be driven by hand in tests or notebooks.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any

import torch

from grpolab.algo.advantages import rows_in_loss
from grpolab.config import GRPOConfig
from grpolab.forward.logprob_pass import batched_log_probs
from grpolab.rollout.buffer import Minibatch
from grpolab.rollout.engines.base import GenerationEngine, SamplingParams


def encode_prompts(task: Any, tokenizer: Any, rows: list[dict], max_prompt_length: int | None) -> list[list[int]]:
    """Prompt text (instruction + chat template) to token ids; raises if a prompt exceeds the limit.

    Raises:
        ValueError: naming the row's uid when its prompt is longer than ``algo.max_prompt_length`` tokens
            (we do not cut prompts silently).
    """
    out = []
    for row in rows:
        text = task.format_prompt(row, tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            raise ValueError(f"prompt {row['uid']!r} has {len(ids)} tokens > algo.max_prompt_length={max_prompt_length}")
        out.append(ids)
    return out


class RolloutProducer:
    """Turns training rows into scored, advantage-weighted :class:`Minibatch` objects.

    Args:
        cfg: the validated algorithm settings.
        task: the task (prompt formatting).
        tokenizer: the policy's tokenizer.
        engine: a :class:`~grpolab.rollout.engines.base.GenerationEngine`.
        verifier: a callable ``(completions, **columns) -> RewardOutput`` (``.rewards``, ``.per_func``).
        needs_sampler_logp: store log alpha with every minibatch (needed whenever a minibatch can be trained at a
            lag > 0); None = ``cfg.reuses_samples``.

    When a minibatch needs ``log alpha`` (k > 1, i > 1 or async) and the engine does not recompute it
    (``engine.recompute_sampler_logp`` false: vLLM and ``hf_copy`` by default), the log-probs the engine
    reports for the sampled tokens (``Generation.sampler_logp``; Hugging Face engines are asked for them) are
    ``mb.sampler_logp``, without a forward over the buffer. ``recompute_sampler_logp`` or
    ``algo.vllm_importance_sampling_correction`` asks for the trainer's own ``log alpha`` (TRL recomputes
    it). The engine's values are kept in ``mb.engine_logp`` either way (the mismatch metrics read them).
    """

    def __init__(self, cfg: GRPOConfig, task: Any, tokenizer: Any, engine: GenerationEngine, verifier: Any,
                 needs_sampler_logp: bool | None = None):
        self.cfg = cfg
        self.task = task
        self.tokenizer = tokenizer
        self.engine = engine
        self.verifier = verifier
        self.counters = {"unscorable": 0, "truncated": 0, "completions": 0}
        self._lock = threading.Lock()  # a background sampler and validation may both count
        # log alpha is stored whenever a minibatch can be trained at a lag > 0: sample reuse (k > 1 or i > 1), or
        # asynchronous generation (with async even k = i = 1 trains at lag >= 1). None = decided by cfg alone.
        self.needs_sampler_logp = cfg.reuses_samples if needs_sampler_logp is None else bool(needs_sampler_logp)

    def with_engine(self, engine: GenerationEngine, own_counters: bool = False) -> RolloutProducer:
        """A producer that samples with ``engine``; it shares this one's counters (e.g. for validation) unless
        ``own_counters`` (a background buffer, counted by :meth:`add_counts` when it is handed over)."""
        other = copy.copy(self)
        other.engine = engine
        if own_counters:
            other.counters = dict.fromkeys(self.counters, 0)
            other._lock = threading.Lock()
        return other

    def summary(self, prefix: str = "", names: tuple[str, ...] = ("completions", "unscorable", "truncated")
                ) -> dict[str, int]:
        """The counters ``names`` for ``summary.json``, each prefixed with ``prefix``."""
        return {f"{prefix}{k}": self.counters.get(k, 0) for k in names}

    def add_counts(self, counters: dict[str, int]) -> None:
        """Add another producer's counts to this one's."""
        with self._lock:
            for k, v in counters.items():
                self.counters[k] = self.counters.get(k, 0) + v

    def sampling(self, greedy: bool = False, generator: torch.Generator | None = None,
                 log_probs: bool = False) -> SamplingParams:
        c = self.cfg
        return SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k or 0,
                              max_new_tokens=c.max_completion_length, do_sample=not greedy, generator=generator,
                              return_log_probs=log_probs)

    def sample(self, policy: Any, rows: list[dict], num_generations: int, greedy: bool = False,
               step: int | None = None, generator: torch.Generator | None = None,
               log_probs: bool = False) -> dict[str, Any]:
        """Generate ``num_generations`` completions per row and score them (rows stay grouped, row-major).

        ``step`` (the optimizer step, when training) is named in errors. ``generator`` is the sampling RNG
        (None = torch's global RNG). ``log_probs`` asks the engine for the sampled tokens' log-probs.

        Returns:
            dict with ``generation`` (:class:`~grpolab.rollout.engines.base.Generation`), ``rows`` (each input row
            repeated), ``completions`` (decoded text of the masked tokens), ``rewards`` [N] float (NaN =
            unscorable), ``per_func`` (name -> list of float|None).
        """
        prompts = encode_prompts(self.task, self.tokenizer, rows, self.cfg.max_prompt_length)
        rep_rows = [r for r in rows for _ in range(num_generations)]
        rep_prompts = [p for p in prompts for _ in range(num_generations)]
        gen = self.engine.generate(policy, rep_prompts, self.sampling(greedy, generator, log_probs))
        texts = [self.tokenizer.decode(ids[m].tolist(), skip_special_tokens=True)
                 for ids, m in zip(gen.completion_ids, gen.completion_mask)]
        columns = {k: [r.get(k) for r in rep_rows] for k in rep_rows[0] if k not in ("prompt",)}
        columns["truncated"] = gen.truncated.tolist()
        scored = self.verifier(texts, **columns)
        rewards = [math.nan if v is None else float(v) for v in scored.rewards]
        for i, (v, raw) in enumerate(zip(rewards, scored.rewards)):
            if raw is not None and not math.isfinite(v):  # None is the only way to say "unscorable"
                where = "" if step is None else f"step {step}: "
                raise ValueError(f"{where}reward of completion {i} (prompt {rep_rows[i]['uid']!r}) is {raw}: "
                                 f"verifiers must return a finite float or None")
        if self.cfg.truncated_reward is not None:  # explicit policy for completions that never stopped (#14)
            rewards = [self.cfg.truncated_reward if t else r for r, t in zip(rewards, gen.truncated.tolist())]
        with self._lock:
            self.counters["completions"] += len(texts)
            self.counters["unscorable"] += sum(math.isnan(r) for r in rewards)
            self.counters["truncated"] += int(gen.truncated.sum())
            self.counters["reward_timeouts"] = self.counters.get("reward_timeouts", 0) + int(
                getattr(scored, "num_timeouts", 0) + getattr(scored, "num_batch_timeouts", 0))
        return {"generation": gen, "rows": rep_rows, "completions": texts,
                "rewards": torch.tensor(rewards, dtype=torch.float32), "per_func": scored.per_func}

    def sampled_and_greedy(self, policy: Any, rows: list[dict], num_generations: int) -> dict[str, dict[str, Any]]:
        """Validation samples: ``sampled`` (``num_generations`` per row at the training temperature), then ``greedy``
        (one per row), each as :meth:`sample` returns them."""
        sampled = self.sample(policy, rows, num_generations)
        return {"sampled": sampled, "greedy": self.sample(policy, rows, 1, greedy=True)}

    def produce(self, policy: Any, reference: Any | None, rows: list[dict], round_index: int,
                policy_version: int, generator: torch.Generator | None = None,
                reference_version: int = 0) -> list[Minibatch]:
        """Build the ``steps_per_generation`` minibatches of one sampler refresh.

        ``rows`` holds ``steps_per_generation x prompts_per_step`` distinct prompts; minibatch ``j`` takes
        the ``j``-th slice. All completions are sampled by the sampler alpha, whose weights are ``policy``'s
        (the live policy, or the copy an engine that owns its weights samples from); its log-probs come from
        ``policy`` too. ``policy_version`` is the optimizer step those weights are from; ``reference_version`` that of
        ``reference``'s weights (:meth:`add_reference_logp`).
        """
        c = self.cfg
        recompute = self.engine.recompute_sampler_logp or c.vllm_importance_sampling_correction
        s = self.sample(policy, rows, c.num_generations, step=policy_version, generator=generator,
                        log_probs=self.needs_sampler_logp and not recompute)
        gen, n_per = s["generation"], c.per_device_train_batch_size
        uids = [r["uid"] for r in s["rows"]]
        # One group per drawn prompt: sample() repeats rows[k] num_generations times in order, so a prompt
        # drawn twice (a small dataset crossing an epoch) makes two groups of G, never one of 2G.
        draw = [k for k in range(len(rows)) for _ in range(c.num_generations)]
        if [rows[k]["uid"] for k in draw] != uids:
            raise RuntimeError("rollout rows are out of order with their prompts")  # pragma: no cover
        group_ids = torch.tensor(draw, dtype=torch.long)
        minibatches = []
        for j in range(c.steps_per_generation):
            sl = slice(j * n_per, (j + 1) * n_per)
            rewards = s["rewards"][sl]
            # Unscorable rows, and truncated ones under mask_truncated_completions, leave the loss AND their
            # group's baseline (docs/guide/pitfalls.md #11); the zero-variance mask is the paper's 1{sigma != 0}.
            adv, keep = rows_in_loss(rewards, group_ids[sl], gen.completion_mask[sl], gen.truncated[sl],
                                     scale_rewards=c.scale_rewards, epsilon=c.advantage_epsilon,
                                     zero_std_threshold=c.zero_std_threshold,
                                     mask_zero_std_groups=c.mask_zero_std_groups,
                                     mask_truncated_completions=c.mask_truncated_completions)
            mb = Minibatch(
                prompt_ids=gen.prompt_ids[sl], prompt_mask=gen.prompt_mask[sl],
                completion_ids=gen.completion_ids[sl], completion_mask=gen.completion_mask[sl],
                truncated=gen.truncated[sl], group_ids=group_ids[sl], rewards=rewards,
                advantages=adv.advantages, zero_std=adv.zero_std, loss_mask=keep,
                round=round_index, index=j, policy_version=policy_version,
                info={"uids": uids[sl], "prompts": [r["prompt"] for r in s["rows"][sl]],
                      "completions": s["completions"][sl], "answers": [r["answer"] for r in s["rows"][sl]],
                      "per_func": {k: v[sl] for k, v in s["per_func"].items()}, "group_std": adv.group_std},
                engine_logp=None if gen.sampler_logp is None else gen.sampler_logp[sl],
            )
            mb = _trim(mb)
            if self.needs_sampler_logp and mb.engine_logp is not None and not recompute:
                mb.sampler_logp, mb.sampler_logp_from_engine = mb.engine_logp, True  # log alpha, no trainer forward
            elif self.needs_sampler_logp or (c.vllm_importance_sampling_correction and mb.engine_logp is not None):
                # log alpha from the trainer's forward: needed whenever the policy can differ from the sampler,
                # and by the engine/trainer importance-sampling correction. Every row, in the training pass's
                # micro-batches: same shapes, so at lag 0 the ratio is exactly 1 (docs/guide/pitfalls.md #8)
                mb.sampler_logp = batched_log_probs(policy, mb.tensors(), c.temperature, c.micro_batch_size,
                                                    c.shared_prompt_forward)
            minibatches.append(mb)
        self.add_reference_logp(minibatches, reference, reference_version)
        return minibatches

    def add_reference_logp(self, minibatches: list[Minibatch], reference: Any | None, version: int = 0) -> None:
        """Fill ``ref_logp`` [B, L] of each minibatch with the reference model's log-probs and stamp it with
        ``reference_version = version`` (the step whose policy weights ``reference`` holds); no-op without one."""
        if reference is None:
            return
        for mb in minibatches:
            mb.ref_logp = batched_log_probs(reference, mb.tensors(), self.cfg.temperature, self.cfg.micro_batch_size,
                                            self.cfg.shared_prompt_forward)
            mb.reference_version = version


def _trim(mb: Minibatch) -> Minibatch:
    """Drop columns of padding shared by every row (left of prompts, right of completions)."""
    p_keep = mb.prompt_mask.any(0).nonzero()
    if len(p_keep):
        first = int(p_keep[0])
        mb.prompt_ids, mb.prompt_mask = mb.prompt_ids[:, first:], mb.prompt_mask[:, first:]
    c_keep = mb.completion_mask.any(0).nonzero()
    last = int(c_keep[-1]) + 1 if len(c_keep) else 1
    mb.completion_ids, mb.completion_mask = mb.completion_ids[:, :last], mb.completion_mask[:, :last]
    mb.loss_mask = mb.loss_mask[:, :last]
    if mb.engine_logp is not None:
        mb.engine_logp = mb.engine_logp[:, :last]
    return mb
