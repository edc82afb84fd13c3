"""Shared-prompt forward: run each distinct prompt once and its completions on top of the shared KV cache.

The ``G`` completions of a group continue one prompt. Instead of ``G`` full forwards over
``prompt + completion``, the prompt is run once per distinct prompt with ``use_cache=True``, its key/value
cache is expanded to one row per completion (an index, so gradients from every completion flow back into
the one prompt pass), and the completions are run on top of it with the same attention mask and position
ids as the plain path. This is exact: the same logits up to float round-off, and the same gradients.

Also the padding helpers used by every log-prob pass: columns that are padding in every row of a
micro-batch are dropped before the forward.
"""

from __future__ import annotations

from typing import Any

import torch


def trim_padding(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop prompt columns that are left padding in every row and completion columns that are right padding
    in every row. The dropped columns are masked keys (or queries after every real token), so log-probs of
    the kept positions do not change. At least one prompt and one completion column are kept.

    Args:
        prompt_ids, prompt_mask: [B, P], left-padded. completion_ids, completion_mask: [B, L].

    Returns:
        The four tensors, ``[B, P']`` and ``[B, L']`` with ``P' <= P`` and ``L' <= L``.
    """
    p_cols = prompt_mask.bool().any(0).nonzero()
    first = min(int(p_cols[0]), prompt_mask.shape[1] - 1) if len(p_cols) else max(prompt_mask.shape[1] - 1, 0)
    c_cols = completion_mask.bool().any(0).nonzero()
    last = int(c_cols[-1]) + 1 if len(c_cols) else 1
    return (prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :last], completion_mask[:, :last])


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows that share the same prompt (ids and mask).

    Returns:
        ``(first [U] long, inverse [B] long)``: row ``first[u]`` holds distinct prompt ``u``, and row ``i``
        has prompt ``inverse[i]``; or None when no two rows share a prompt (nothing to save).
    """
    n = prompt_ids.shape[0]
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if unique.shape[0] == n:
        return None
    rows = torch.arange(n, device=prompt_ids.device)
    first = torch.full((unique.shape[0],), n, dtype=torch.long, device=prompt_ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def supports_shared_prompt(model: Any) -> bool:
    """True for decoder-only Hugging Face models whose KV cache can be reused with grad.

    Gradient checkpointing recomputes layers (and would append to the cache twice), sliding-window layers
    keep a truncated cache, and encoder-decoder models have no such prompt/completion split: those use the
    plain forward.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5 name
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    return not getattr(config, "use_sliding_window", False)


def shared_prompt_logits(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor | None:
    """Logits that predict each completion token, computing each distinct prompt once.

    Row ``i``'s logits at ``t`` predict ``completion_ids[i, t]``: position ``t = 0`` is the last prompt
    position, ``t >= 1`` the completion position ``t - 1`` (as in the plain ``prompt + completion``
    forward with ``logits_to_keep = L + 1`` and the last position dropped). Position ids are
    ``cumsum(mask) - 1`` over the full ``prompt + completion`` mask, as ``generate`` uses them.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded (1 = real token). completion_ids, completion_mask: [B, L].

    Returns:
        ``[B, L, V]`` logits in the model's dtype, or None when no prompt is shared or the model is not
        supported (see :func:`supports_shared_prompt`); the caller then runs the plain forward.
    """
    if not supports_shared_prompt(model):
        return None
    groups = prompt_groups(prompt_ids, prompt_mask)
    if groups is None:
        return None
    first, inverse = groups
    p_mask = prompt_mask[first].long()
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids[first], attention_mask=p_mask, position_ids=p_pos, logits_to_keep=1,
                use_cache=True)
    head = out.logits[:, -1:][inverse]  # [B, 1, V]: predicts the first completion token
    length = completion_ids.shape[1]
    if length == 1:
        return head
    cache_name = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    cache = getattr(out, cache_name)
    cache.batch_select_indices(inverse)  # [U, ...] -> [B, ...]; differentiable indexing
    mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)[:, :-1]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1]:]
    tail = model(input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=position_ids,
                 use_cache=True, **{cache_name: cache}).logits  # [B, L - 1, V]
    return torch.cat([head, tail], dim=1)
