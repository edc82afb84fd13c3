"""The one forward pass that turns (prompt, completion) token ids into per-token log-probs.

The sampler's log-probs, the reference log-probs and the training log-probs all come from this function,
so they use the same sequence layout, position ids and temperature transform as ``generate`` (docs/guide/pitfalls.md
#8): the first on-policy ratio is then exactly 1.
"""

from __future__ import annotations

from typing import Any

import torch

from grpolab.algo.logprobs import entropy_from_logits, token_log_probs
from grpolab.forward.buckets import length_buckets
from grpolab.forward.shared_prompt import shared_prompt_logits, trim_padding


def completion_log_probs(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    shared_prompt: bool = False,
    max_buckets: int = 4,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each completion token under ``model`` with logits divided by ``temperature``.

    Args:
        prompt_ids: [B, P] long, left-padded. prompt_mask: [B, P] (1 = real token).
        completion_ids: [B, L] long. completion_mask: [B, L] (1 = real token up to the first stop).
        temperature: sampling temperature (> 0).
        with_entropy: also return the per-token entropy of the tempered distribution (no grad).
        shared_prompt: run each distinct prompt once and the completions on its KV cache
            (:mod:`grpolab.forward.shared_prompt`, ``algo.shared_prompt_forward``); same result to float
            round-off, falls back to the plain forward when no rows share a prompt.
        max_buckets: split the rows into up to this many completion-length buckets when that computes
            fewer padded positions (:func:`~grpolab.forward.buckets.length_buckets`); 1 = one pass.

    Returns:
        ``(logp [B, L] float32, entropy [B, L] or None)``. Positions outside ``completion_mask`` hold
        finite values (0 in columns that are padding in every row) that callers must mask out.
    """
    buckets = length_buckets(prompt_ids, prompt_mask, completion_mask, shared_prompt, max_buckets)
    if buckets is not None:
        parts = [completion_log_probs(model, prompt_ids[b], prompt_mask[b], completion_ids[b], completion_mask[b],
                                      temperature, with_entropy, shared_prompt, max_buckets=1) for b in buckets]
        inverse = torch.argsort(torch.cat(buckets))  # back to the input row order (differentiable gather)
        logp = torch.cat([p[0] for p in parts])[inverse]
        entropy = torch.cat([p[1] for p in parts])[inverse] if with_entropy else None
        return logp, entropy
    width = completion_ids.shape[1]
    # Columns that are padding in every row change nothing; drop them (pad per micro-batch, not per buffer).
    prompt_ids, prompt_mask, completion_ids, completion_mask = trim_padding(prompt_ids, prompt_mask,
                                                                            completion_ids, completion_mask)
    logits = None
    if shared_prompt:
        logits = shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    if logits is None:
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
        # generate() derives positions from the attention mask; do the same so left padding is invisible.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        length = completion_ids.shape[1]
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    logits_to_keep=length + 1, use_cache=False)
        logits = out.logits[:, :-1]  # logits at position t predict token t + 1 (kept in the model's dtype)
    logp = token_log_probs(logits, completion_ids, temperature)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach() / temperature)
    pad = width - completion_ids.shape[1]
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))
        entropy = None if entropy is None else torch.nn.functional.pad(entropy, (0, pad))
    return logp, entropy


@torch.no_grad()
def batched_log_probs(model: Any, batch: dict[str, torch.Tensor], temperature: float,
                      micro_batch_size: int | None, shared_prompt: bool = False) -> torch.Tensor:
    """:func:`completion_log_probs` without grad, in micro-batches; returns [B, L] float32 on CPU.

    Uses the training step's micro-batches (same rows, so the same buckets and shapes): at equal weights it
    returns bitwise the training pass's log-probs (the first on-policy ratio is exactly 1, docs/guide/pitfalls.md #8).
    """
    n = batch["completion_ids"].shape[0]
    was_training = model.training
    model.eval()
    step = micro_batch_size or n
    device = next(model.parameters()).device
    parts = []
    try:
        for s in range(0, n, step):
            logp, _ = completion_log_probs(
                model, *(batch[k][s:s + step].to(device) for k in
                         ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")), temperature,
                shared_prompt=shared_prompt)
            parts.append(logp.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(parts)
