"""Prompt lengths, checked once at setup: a default limit from the model's context, and every row measured.

A buffer is padded to its longest prompt, so one over-long row can take a run out of memory with no message
(a 3,002-character row in a 40-row file once took a process to 22.6 GB). So, before the first step:

- ``algo.max_prompt_length: null`` becomes ``max_position_embeddings - algo.max_completion_length`` of the
  model's config (or ``tokenizer.model_max_length - algo.max_completion_length`` when the config has
  none and the tokenizer's limit is finite), so a prompt and its completion fit the context;
- every row of every split (train, val, test) is formatted and tokenized exactly as the sampler will
  (:func:`grpolab.rollout.producer.encode_prompts`), and rows over the limit are an error naming them
  (uid, split, length in tokens). Nothing is cut silently.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from grpolab.errors import ConfigError

log = logging.getLogger(__name__)

# Tokenizers without a limit report model_max_length = int(1e30).
_UNSET_TOKENIZER_LIMIT = 10**9


def model_context_length(spec: Any) -> int | None:
    """``max_position_embeddings`` of the model a spec describes, read without loading weights.

    Tiny specs carry it in ``spec.arch``; others are read from the folder's / hub id's ``config.json``.
    ``None`` when unknown.
    """
    arch = getattr(spec, "arch", None)
    if isinstance(arch, dict) and not getattr(spec, "path", None) and arch.get("max_position_embeddings"):
        return int(arch["max_position_embeddings"])
    source = getattr(spec, "source", None)
    if not source:
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(source, trust_remote_code=bool(getattr(spec, "trust_remote_code", False)))
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def default_max_prompt_length(spec: Any, tokenizer: Any, max_completion_length: int) -> tuple[int | None, str]:
    """The prompt budget left by the model's context after ``max_completion_length`` new tokens.

    Returns:
        ``(limit, why)``: the limit (``None`` when neither the model nor the tokenizer states a context)
        and a phrase saying where it comes from, for messages.

    Raises:
        ValueError: if ``algo.max_completion_length`` alone fills the context.
    """
    context, source = model_context_length(spec), "the model's max_position_embeddings"
    if context is None:
        limit = getattr(tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < _UNSET_TOKENIZER_LIMIT:
            context, source = limit, "the tokenizer's model_max_length"
    if context is None:
        return None, "no context length known"
    if max_completion_length >= context:
        raise ConfigError(
            f"algo.max_completion_length={max_completion_length} leaves no room for a prompt in the context of "
            f"{context} tokens ({source}); lower algo.max_completion_length"
        )
    return context - max_completion_length, f"{source} {context} - algo.max_completion_length {max_completion_length}"


def check_prompt_lengths(task: Any, tokenizer: Any, limit: int, why: str = "",
                         splits: tuple[str, ...] = ("train", "val", "test")) -> dict[str, int]:
    """Measure every prompt of every split; refuse the run when one is longer than ``limit`` tokens.

    Args:
        task: the task (its ``splits()`` and ``format_prompt``).
        tokenizer: the policy's tokenizer.
        limit: ``algo.max_prompt_length``.
        why: where the limit comes from (for the message).
        splits: the splits to check.

    Returns:
        The longest prompt per split, in tokens.

    Raises:
        ValueError: naming up to 5 offending rows (uid, split, length) and how many there are.
    """
    rows_of = task.splits()
    longest: dict[str, int] = {}
    too_long: list[tuple[int, str, str]] = []
    for split in splits:
        rows = rows_of.get(split) or []
        if not rows:
            continue
        texts = [task.format_prompt(row, tokenizer) for row in rows]
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        longest[split] = max(lengths)
        too_long += [(n, split, str(row["uid"])) for row, n in zip(rows, lengths, strict=True) if n > limit]
    if too_long:
        too_long.sort(reverse=True)
        shown = "; ".join(f"uid {uid!r} in split {split}: {n} tokens" for n, split, uid in too_long[:5])
        more = f" (and {len(too_long) - 5} more)" if len(too_long) > 5 else ""
        raise ConfigError(
            f"{task.name}: {len(too_long)} prompt(s) longer than algo.max_prompt_length={limit} tokens"
            f"{' (' + why + ')' if why else ''}: {shown}{more}. Remove or shorten these rows, or raise "
            "algo.max_prompt_length (prompts are never cut silently)"
        )
    log.info("prompt lengths checked (limit %d tokens): longest %s", limit, longest)
    return longest


def with_prompt_limit(cfg: Any, spec: Any, task: Any, tokenizer: Any) -> Any:
    """``cfg`` with ``max_prompt_length`` filled from the model's context when it is ``None``, after checking every
    row of every split against the limit in force.

    Args:
        cfg: the :class:`~grpolab.config.GRPOConfig` (not changed: a new one is returned).
        spec: the model spec.
        task: the task.
        tokenizer: the policy's tokenizer.

    Returns:
        A copy of ``cfg`` whose ``max_prompt_length`` is the limit in force (``None`` when no context length is
        known and none was set: then nothing is checked).

    Raises:
        ValueError: naming the rows longer than the limit.
    """
    default, why = default_max_prompt_length(spec, tokenizer, cfg.max_completion_length)
    limit = cfg.max_prompt_length
    if limit is None:
        limit = default
        if default is not None:
            log.info("algo.max_prompt_length = %d (%s)", default, why)
    elif default is not None and limit > default:
        log.warning("algo.max_prompt_length=%d + algo.max_completion_length=%d exceed the model's context (%s)",
                    limit, cfg.max_completion_length, why)
        why = "set in the config"
    else:
        why = "set in the config"
    if limit is None:
        log.warning("no context length known for %s: prompt lengths are not checked", getattr(spec, "source", spec))
    else:
        check_prompt_lengths(task, tokenizer, limit, why)
    return cfg if limit == cfg.max_prompt_length else dataclasses.replace(cfg, max_prompt_length=limit)
