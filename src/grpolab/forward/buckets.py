"""Length buckets for the log-prob passes: sort a micro-batch's rows by completion length and split it when
that saves more padded tokens than the extra forward calls cost.

Rows are computed independently (each row attends only to itself), so any split gives the same log-probs
and gradients up to float round-off; only the padding that is computed changes.
"""

from __future__ import annotations

import torch

# One extra forward(+backward) call costs about as much as this many padded token positions on a small
# model on a CPU (python and kernel-launch overhead); larger models pay less per call relative to a token.
CALL_OVERHEAD_TOKENS = 96


def length_buckets(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
                   shared_prompt: bool, max_buckets: int = 4) -> list[torch.Tensor] | None:
    """Row indices of each bucket, or None when one pass over the whole micro-batch is cheapest.

    The estimated cost of ``k`` buckets (``k`` in 1, 2, 4, ... up to ``max_buckets``, rows sorted by
    completion length, equal row counts) is the padded token positions computed, ``sum_b rows_b x
    (prompt_width_b + completion_width_b)`` (with ``shared_prompt``: distinct prompts x prompt width), plus
    ``CALL_OVERHEAD_TOKENS`` per bucket.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded. completion_mask: [B, L] (1 up to the first stop).
        shared_prompt: prompts are computed once per distinct prompt in a bucket.
        max_buckets: most buckets to use (1 disables bucketing).

    Returns:
        A list of [n_b] long index tensors covering every row once, or None.
    """
    n = completion_mask.shape[0]
    if max_buckets < 2 or n < 2:
        return None
    lengths = completion_mask.bool().sum(1)
    prompt_lengths = prompt_mask.bool().sum(1)
    order = torch.sort(lengths, stable=True).indices
    if shared_prompt:
        key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
        prompt_id = torch.unique(key, dim=0, return_inverse=True)[1]

    def cost(parts: list[torch.Tensor]) -> float:
        total = 0.0
        for rows in parts:
            width = int(prompt_lengths[rows].max())
            prompts = len(torch.unique(prompt_id[rows])) if shared_prompt else len(rows)
            total += prompts * width + len(rows) * max(int(lengths[rows].max()), 1) + CALL_OVERHEAD_TOKENS
        return total

    best, best_cost, k = None, cost([order]), 2
    while k <= min(max_buckets, n):
        parts = list(torch.tensor_split(order, k))
        c = cost(parts)
        if c < best_cost:
            best, best_cost = parts, c
        k *= 2
    return best
