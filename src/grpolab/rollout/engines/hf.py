"""``rollout=hf``: sampling on the live policy with Hugging Face models (our decode loop or ``generate``).

:class:`HFGenerationEngine` samples in place: no copy of the weights, nothing to push. It is the CPU default,
fastest when generation is not overlapped with training.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from grpolab.algo.masks import completion_mask
from grpolab.errors import ConfigError
from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory, decode_cache_bytes
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams, left_pad
from grpolab.rollout.engines.decode import sample_completions, supports_decode_loop
from grpolab.rollout.engines.kv_cache import CACHE_IMPLEMENTATIONS

GENERATION_BATCH_KNOB = "rollout.generation_batch_size=16 (sequences per generate call)"


class HFGenerationEngine(GenerationEngine):
    """Sampling with ``model.generate``: KV cache, left padding, explicit sampling parameters.

    Every sampling parameter is passed explicitly in a fresh ``GenerationConfig``, and during the call the
    model's own ``generation_config`` is replaced by a blank one (:func:`model_generation_defaults_cleared`):
    ``generate`` fills every setting left unset from the model's ``generation_config.json`` (Qwen2.5-Instruct
    ships ``repetition_penalty=1.1``), which would sample from a distribution other than the one whose
    log-probs the trainer stores. Only transformers' neutral global defaults remain (docs/guide/pitfalls.md #13).

    Args:
        stop_token_ids: every id that ends a completion.
        pad_token_id: id used for padding.
        generation_batch_size: sequences per ``generate`` call (memory knob; None = all at once).
        drop_finished_rows: sample with :func:`~grpolab.rollout.engines.decode.sample_completions`, which stops
            computing a row once it has stopped (same distribution; used when top_k=0 and top_p=1 or greedy,
            and the model supports it), instead of ``model.generate``.
        recompute_sampler_logp: True (default here): log alpha comes from a trainer forward in the training
            pass's micro-batch shapes, so the lag-0 ratio is exactly 1 (docs/guide/pitfalls.md #8). False: the log-probs
            of the sampled tokens recorded while sampling are log alpha (no extra forward over the buffer;
            equal to the forward's within float round-off, ~1e-6 in float32, more under bf16 autocast).
        cache_implementation: the decode loop's KV cache (``drop_finished_rows``; ``generate`` keeps its own):
            ``"dynamic"`` (transformers' ``DynamicCache``) or ``"preallocated"``
            (:class:`~grpolab.rollout.engines.kv_cache.PreallocatedCache`: written in place, same tokens and log-probs).

    Raises:
        ValueError: no stop token, ``generation_batch_size < 1``, a non-boolean ``recompute_sampler_logp`` or an
            unknown ``cache_implementation``.
    """

    def __init__(self, stop_token_ids: list[int], pad_token_id: int, generation_batch_size: int | None = None,
                 drop_finished_rows: bool = True, recompute_sampler_logp: bool = True,
                 cache_implementation: str = "dynamic"):
        if not stop_token_ids:
            raise ValueError("rollout: at least one stop token id is needed")
        if generation_batch_size is not None and generation_batch_size < 1:
            raise ValueError(f"rollout.generation_batch_size must be >= 1 or null, got {generation_batch_size}")
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.generation_batch_size = generation_batch_size
        self.drop_finished_rows = drop_finished_rows
        if not isinstance(recompute_sampler_logp, bool):
            raise ValueError(f"rollout.recompute_sampler_logp must be true or false, got {recompute_sampler_logp!r}")
        self.recompute_sampler_logp = recompute_sampler_logp
        if cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(f"rollout.cache_implementation must be one of {', '.join(CACHE_IMPLEMENTATIONS)}, "
                             f"got {cache_implementation!r}")
        self.cache_implementation = cache_implementation

    # With rollout.async_generation the sampler must own its weights: the in-place engine becomes the copy engine.
    async_target = "grpolab.rollout.engines.hf_copy.HFSamplerCopyEngine"

    @classmethod
    def check_config(cls, args: dict[str, Any]) -> None:
        """Refuse a bad ``rollout.generation_batch_size`` or ``rollout.cache_implementation`` before any model is built.

        Raises:
            ConfigError: naming the key and a value that works.
        """
        batch = args.get("generation_batch_size")
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise ConfigError(f"rollout.generation_batch_size must be null (all at once) or an int >= 1, got {batch!r}")
        cache = args.get("cache_implementation", "dynamic")
        if cache not in CACHE_IMPLEMENTATIONS:  # the decode loop's KV cache
            raise ConfigError(f"rollout.cache_implementation must be one of {', '.join(CACHE_IMPLEMENTATIONS)}, got "
                              f"{cache!r}: e.g. rollout.cache_implementation=dynamic")

    @classmethod
    def memory_needs(cls, args: dict[str, Any], shape: GenerationShape) -> SamplerMemory:
        """In place: no copy; while generating, the KV cache and decode logits of ``rollout.generation_batch_size``
        sequences at once (None: a whole refresh, ``shape.train_rows``), and the same for held-out batches
        (validation samples in place too: ``shape.eval_rows`` capped alike).

        Returns:
            :class:`~grpolab.plan.sampler_memory.SamplerMemory` in bytes per training process.
        """
        cap = args.get("generation_batch_size") or None
        rows, eval_rows = (min(r, cap) if cap else r for r in (shape.train_rows, shape.eval_rows))
        knobs = (GENERATION_BATCH_KNOB,) if max(rows, eval_rows) > 16 else ()
        return SamplerMemory(cache_bytes=decode_cache_bytes(shape, rows), generation_rows=rows,
                             eval_cache_bytes=decode_cache_bytes(shape, eval_rows), cache_knobs=knobs,
                             notes=("rollout in place: weight pushes are counted but move nothing",))

    def _config(self, params: SamplingParams) -> GenerationConfig:
        # With an explicit generator, generate() runs its greedy loop and _GeneratorSampler does the sampling.
        sample_here = params.do_sample and params.generator is None
        kwargs = dict(max_new_tokens=params.max_new_tokens, eos_token_id=self.stop_token_ids,
                      pad_token_id=self.pad_token_id, use_cache=True, do_sample=sample_here)
        if sample_here:
            kwargs.update(temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p)
        if params.return_log_probs:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        return GenerationConfig(**kwargs)

    @torch.no_grad()
    def generate(self, model: Any, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """Sample one completion per prompt (repeat a prompt G times for a group).

        Returns:
            A :class:`Generation` on CPU.
        """
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        config = self._config(params)
        extra = {}
        if params.do_sample and params.generator is not None:
            extra["logits_processor"] = LogitsProcessorList([_GeneratorSampler(params)])
        step = self.generation_batch_size or len(prompts)
        loop = self.drop_finished_rows and supports_decode_loop(model) and (
            not params.do_sample or ((params.top_k or 0) == 0 and params.top_p == 1.0))
        parts = []
        try:
            with model_generation_defaults_cleared(model, self.stop_token_ids, self.pad_token_id):
                for start in range(0, len(prompts), step):
                    ids, mask = left_pad(prompts[start:start + step], self.pad_token_id)
                    if loop:
                        comp, logp = sample_completions(
                            model, ids.to(device), mask.to(device), params.max_new_tokens, self.stop_token_ids,
                            self.pad_token_id, params.temperature, params.do_sample, params.return_log_probs,
                            generator=params.generator, cache_implementation=self.cache_implementation)
                        parts.append((ids, mask, comp.cpu(), None if logp is None else logp.cpu()))
                        continue
                    if extra:
                        extra["logits_processor"][0].reset()
                    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                         generation_config=config, **extra)
                    seqs = out.sequences if params.return_log_probs else out
                    comp = seqs[:, ids.shape[1]:].cpu()
                    logp = None
                    if params.return_log_probs:  # with a generator, the scores generate() sees are one-hot
                        logp = extra["logits_processor"][0].sampled_log_probs() if extra else \
                            _scores_log_probs(out.scores, comp)
                    parts.append((ids, mask, comp, logp))
        finally:
            model.train(was_training)
        return _merge(parts, self.pad_token_id, self.stop_token_ids)


@contextmanager
def model_generation_defaults_cleared(model: Any, stop_token_ids: list[int], pad_token_id: int) -> Iterator[None]:
    """Within the block ``model.generation_config`` is blank (stop and pad ids only), then restored.

    ``generate`` merges the model's ``generation_config`` into the one it is given: every field we leave
    unset (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``bad_words_ids``, ...) is
    taken from the model folder's ``generation_config.json``. With a blank one, only our config and
    transformers' neutral global defaults decide what is sampled.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=list(stop_token_ids), pad_token_id=pad_token_id,
                                               bos_token_id=getattr(saved, "bos_token_id", None))
    try:
        yield
    finally:
        model.generation_config = saved


def _scores_log_probs(scores: tuple[torch.Tensor, ...], completion: torch.Tensor) -> torch.Tensor:
    """[B, L] log-probs of ``completion``'s tokens under ``generate``'s processed scores (one [B, V] a step)."""
    if not scores:
        return torch.zeros(completion.shape, dtype=torch.float32)
    logits = torch.stack(scores, 1).float().cpu()
    logp = logits.log_softmax(-1).gather(-1, completion[:, :logits.shape[1], None])[..., 0]
    return torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))  # -inf after a row has stopped


class _GeneratorSampler(LogitsProcessor):
    """Samples the next token with an explicit ``torch.Generator`` inside a greedy ``generate`` loop.

    It applies the warpers Hugging Face's sampling loop applies, in its order (temperature, top-k, top-p),
    draws ``torch.multinomial(softmax(scores), 1, generator=g)`` exactly as ``generate(do_sample=True)`` does
    with the global RNG, and returns scores that are 0 at the drawn token and -inf elsewhere, so the greedy
    argmax picks it. Same seed, same tokens as the global-RNG path; torch's global RNG is never touched.
    With ``params.return_log_probs`` it also keeps the log-prob of each drawn token under the warped
    distribution (what ``_scores_log_probs`` reads from the processed scores on the global-RNG path).
    """

    def __init__(self, params: SamplingParams) -> None:
        self.generator = params.generator
        self.keep_log_probs = params.return_log_probs
        self._log_probs: list[torch.Tensor] = []
        self.warpers = []
        if params.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k:
            self.warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(params.top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, num_samples=1, generator=self.generator)
        if self.keep_log_probs:
            self._log_probs.append(scores.float().log_softmax(-1).gather(1, tokens)[:, 0].cpu())
        out = torch.full_like(scores, -math.inf)
        return out.scatter_(1, tokens, 0.0)

    def reset(self) -> None:
        """Forget the log-probs of the previous ``generate`` call."""
        self._log_probs = []

    def sampled_log_probs(self) -> torch.Tensor:
        """[B, L] float32 log-probs of the drawn tokens (finite; callers mask positions after the stop)."""
        logp = torch.stack(self._log_probs, 1) if self._log_probs else torch.zeros((0, 0))
        return torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]], pad_id: int,
           stop_ids: list[int]) -> Generation:
    """Concatenate generate() chunks. Masks and truncation flags are computed per chunk, before any width
    padding, because the pad id may itself be a stop id (Qwen pads with <|endoftext|>; docs/guide/pitfalls.md #5)."""
    parts = [p if len(p) == 4 else (*p, None) for p in parts]
    p_width = max(p[0].shape[1] for p in parts)
    c_width = max(max(p[2].shape[1] for p in parts), 1)
    fields: dict[str, list[torch.Tensor]] = {"pi": [], "pm": [], "ci": [], "cm": [], "tr": [], "lp": []}
    for ids, mask, comp, logp in parts:
        cm = completion_mask(comp, stop_ids)
        lp, lc = p_width - ids.shape[1], c_width - comp.shape[1]
        fields["pi"].append(torch.nn.functional.pad(ids, (lp, 0), value=pad_id))
        fields["pm"].append(torch.nn.functional.pad(mask, (lp, 0), value=0))
        fields["ci"].append(torch.nn.functional.pad(comp, (0, lc), value=pad_id))
        fields["cm"].append(torch.nn.functional.pad(cm.mask.bool(), (0, lc), value=False))
        fields["tr"].append(cm.truncated.bool())
        if logp is not None:
            logp = torch.where(cm.mask.bool(), logp, torch.zeros_like(logp))
            fields["lp"].append(torch.nn.functional.pad(logp, (0, lc), value=0.0))
    log_probs = torch.cat(fields["lp"]) if len(fields["lp"]) == len(parts) else None
    return Generation(*(torch.cat(fields[k]) for k in ("pi", "pm", "ci", "cm", "tr")), sampler_logp=log_probs)
