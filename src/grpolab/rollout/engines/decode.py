"""A sampling loop on a transformers model's KV cache that stops computing rows once they have stopped.

Hugging Face ``generate`` keeps every row of the batch in each decoding step until all rows have stopped
(finished rows are fed padding). With completions of very different lengths (up to 48 tokens from a
random model: mean about 20) most of that work is wasted. :func:`sample_completions` drops a row from the
batch (and from the KV cache) as soon as it samples a stop token, and runs the prompt of a group (rows with
identical prompts) once, expanding its KV cache to the group's rows. Each row's next token is drawn from the
same distribution as ``generate``'s: ``softmax(logits / temperature)`` in float32 (no top-k/top-p), or the
argmax when greedy; position ids follow the attention mask as in ``generate``. The random draws are
``generate``'s until the first row stops; after that fewer rows draw (same distribution, other numbers).
"""

from __future__ import annotations

from typing import Any

import torch

from grpolab.forward.shared_prompt import prompt_groups
from grpolab.rollout.engines.kv_cache import CACHE_IMPLEMENTATIONS, PreallocatedCache


def supports_decode_loop(model: Any) -> bool:
    """Decoder-only transformers models whose attention layers are all full attention (a KV cache that keeps
    every position, so dropping rows with ``batch_select_indices`` is exact)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or not hasattr(model, "generate"):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    return not getattr(config, "use_sliding_window", False)


@torch.no_grad()
def sample_completions(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                       stop_token_ids: list[int], pad_token_id: int, temperature: float = 1.0,
                       do_sample: bool = True, return_log_probs: bool = False,
                       generator: torch.Generator | None = None,
                       cache_implementation: str = "dynamic") -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample up to ``max_new_tokens`` per row; a row stops at its first stop token.

    Args:
        model: a decoder-only transformers model (see :func:`supports_decode_loop`), in eval mode.
        input_ids: [B, P] long, left-padded prompts. attention_mask: [B, P] (1 = real token).
        max_new_tokens: most tokens per completion (>= 1).
        stop_token_ids: every id that ends a completion.
        pad_token_id: written after a row's stop token.
        temperature: logits are divided by it before the softmax (> 0; ignored when greedy).
        do_sample: sample from the tempered softmax, or take the argmax (greedy).
        return_log_probs: also return each sampled token's log-prob under the distribution it was drawn from
            (``log_softmax(logits / temperature)``; untempered when greedy, as ``generate``'s scores).
        generator: the ``torch.Generator`` of the draws (None = torch's global RNG).
        cache_implementation: ``"dynamic"``: the model's ``DynamicCache`` (grows by ``torch.cat`` each step);
            ``"preallocated"``: after the prefill, a :class:`~grpolab.rollout.engines.kv_cache.PreallocatedCache` of
            ``[B, kv_heads, P + max_new_tokens - 1, head_dim]`` per layer written in place (same tokens and
            log-probs, bit for bit).

    Returns:
        ``(completion_ids, log_probs)``: [B, L] long ids on ``input_ids``' device, ``L <= max_new_tokens``
        the step at which the last row stopped (as ``generate`` returns them, without the prompt), padding
        after each row's stop; [B, L] float32 log-probs (0 after the stop) or None.

    Raises:
        ValueError: ``max_new_tokens < 1`` or an unknown ``cache_implementation``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if cache_implementation not in CACHE_IMPLEMENTATIONS:
        raise ValueError(f"cache_implementation must be one of {CACHE_IMPLEMENTATIONS}, got {cache_implementation!r}")
    batch, device = input_ids.shape[0], input_ids.device
    tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros(batch, max_new_tokens, device=device) if return_log_probs else None
    stops = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long, device=device)
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    groups = prompt_groups(input_ids, mask)  # a group's G rows share one prompt: prefill it once
    rows = groups[0] if groups is not None else slice(None)
    out = model(input_ids=input_ids[rows], attention_mask=mask[rows], position_ids=positions[rows], use_cache=True,
                logits_to_keep=1)
    cache_name = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    cache = getattr(out, cache_name)
    first_logits = out.logits[:, -1]
    if cache_implementation == "preallocated":  # copy (and expand) the prefill into buffers of full length
        rows = groups[1] if groups is not None else torch.arange(batch, device=device)
        cache = PreallocatedCache.from_dynamic(cache, rows, input_ids.shape[1] + max_new_tokens - 1)
    elif groups is not None:  # one cache row per completion
        cache.batch_select_indices(groups[1])
    if groups is not None:  # one first-token distribution per completion
        first_logits = first_logits[groups[1]]
    alive = torch.arange(batch, device=device)
    next_position = positions[:, -1:] + 1
    for t in range(max_new_tokens):
        logits = (first_logits if t == 0 else out.logits[:, -1]).float()
        if do_sample:
            logits = logits / temperature
            token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator)[:, 0]
        else:
            token = logits.argmax(-1)
        tokens[alive, t] = token
        if log_probs is not None:
            log_probs[alive, t] = logits.log_softmax(-1).gather(-1, token[:, None])[:, 0]
        running = ~torch.isin(token, stops)
        if t == max_new_tokens - 1 or not bool(running.any()):
            break
        if not bool(running.all()):  # drop the rows that just stopped, from the batch and the cache
            keep = running.nonzero().flatten()
            cache.batch_select_indices(keep)
            alive, token, mask, next_position = alive[keep], token[keep], mask[keep], next_position[keep]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_position, use_cache=True,
                    **{cache_name: cache})
        next_position = next_position + 1
    return tokens[:, :t + 1], None if log_probs is None else log_probs[:, :t + 1]
