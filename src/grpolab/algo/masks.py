"""Completion masks derived from the FIRST stop token (docs/guide/pitfalls.md #5, #6, #7).

Masks are never derived from pad values: with ``pad == eos`` the stop token itself is trained and only
what follows it is masked; every stop id of the generation config counts; a completion with no stop
token is kept exactly as sampled (nothing is appended) and flagged truncated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class CompletionMask:
    """Output of :func:`completion_mask`.

    Attributes:
        mask: ``[B, L]`` bool, True up to and including the first stop token, False after it.
        truncated: ``[B]`` bool, True when the row contains no stop token (all of it is kept).
        lengths: ``[B]`` long, number of True entries of ``mask`` per row.
    """

    mask: Tensor
    truncated: Tensor
    lengths: Tensor


def completion_mask(completion_ids: Tensor, stop_token_ids: Iterable[int]) -> CompletionMask:
    """Mask each completion up to and including its first stop token.

    Args:
        completion_ids: ``[B, L]`` integer ids as sampled (right-padded with anything).
        stop_token_ids: every id that ends generation (EOS plus the generation config's extra stop ids).

    Returns:
        :class:`CompletionMask`.

    Raises:
        ValueError: if ``completion_ids`` is not 2-D integer or ``stop_token_ids`` is empty.

    Example:
        >>> cm = completion_mask(torch.tensor([[5, 7, 2, 2, 2], [5, 7, 8, 9, 6]]), [2])
        >>> cm.mask.long().tolist(), cm.truncated.tolist(), cm.lengths.tolist()
        ([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], [False, True], [3, 5])
    """
    if completion_ids.dim() != 2 or completion_ids.is_floating_point():
        raise ValueError(
            f"completion_ids must be an integer [B, L] tensor, got {completion_ids.dtype} "
            f"{tuple(completion_ids.shape)}"
        )
    stops = sorted({int(s) for s in stop_token_ids})
    if not stops:
        raise ValueError("stop_token_ids must contain at least one id (EOS)")
    batch, length = completion_ids.shape
    stop_t = torch.tensor(stops, dtype=completion_ids.dtype, device=completion_ids.device)
    is_stop = torch.isin(completion_ids, stop_t)
    has_stop = is_stop.any(dim=1)
    if length > 0:
        first = is_stop.int().argmax(dim=1)  # index of the first True (argmax returns the first maximum)
    else:
        first = torch.zeros(batch, dtype=torch.long, device=completion_ids.device)
    lengths = torch.where(has_stop, first + 1, torch.full_like(first, length)).long()
    positions = torch.arange(length, device=completion_ids.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)
    return CompletionMask(mask=mask, truncated=~has_stop, lengths=lengths)
