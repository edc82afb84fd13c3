"""Token log-probabilities and entropies from logits (TRL's memory-saving helpers).

The sampler and the trainer must apply the same transform (``logits / temperature``) so that the first
on-policy step has ratio exactly 1 (docs/guide/pitfalls.md #8, #13).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """``log_softmax(logits, -1)`` gathered at ``index`` without materialising the full log-softmax.

    For float32/float64 this is ``logits[index] - logsumexp(logits)`` computed row by row (TRL's trick);
    for bf16/fp16 each row of the first dim is upcast to float32 and log-softmaxed separately (TRL keeps the
    low-precision dtype here; we return float32 so ratios keep their precision).

    Args:
        logits: ``[..., V]`` float, typically ``[B, T, V]``.
        index: ``[...]`` integer token ids, same leading shape as ``logits``.

    Returns:
        ``[...]`` log-probabilities, dtype of ``logits`` for float32/64, float32 otherwise.

    Raises:
        ValueError: if the shapes do not match.

    Example:
        >>> selective_log_softmax(torch.tensor([[[2.0, 1.0, 0.0]]]), torch.tensor([[0]]))
        tensor([[-0.4076]])
    """
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(index.shape):
        raise ValueError(
            f"index shape {tuple(index.shape)} must equal logits.shape[:-1] {tuple(logits.shape)}"
        )
    if logits.dim() == 1:
        return selective_log_softmax(logits.unsqueeze(0), index.unsqueeze(0)).squeeze(0)
    idx = index.long().unsqueeze(-1)
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, -1, idx).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return selected - lse
    rows = [
        F.log_softmax(row.float(), dim=-1).gather(-1, row_idx).squeeze(-1)
        for row, row_idx in zip(logits, idx, strict=True)
    ]
    return torch.stack(rows)


def _check_temperature(temperature: float) -> None:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def token_log_probs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probabilities of ``token_ids`` under ``softmax(logits / temperature)`` (docs/guide/pitfalls.md #8).

    Args:
        logits: ``[B, T, V]`` (or ``[..., V]``) float, already aligned so that ``logits[..., t, :]``
            predicts ``token_ids[..., t]``.
        token_ids: ``[B, T]`` integer ids.
        temperature: sampling temperature, ``> 0``.

    Returns:
        ``[B, T]`` log-probabilities (see :func:`selective_log_softmax` for the dtype).

    Raises:
        ValueError: if ``temperature <= 0`` or not finite, or on shape mismatch.

    Example:
        >>> token_log_probs(torch.tensor([[[2.0, 1.0, 0.0]]]), torch.tensor([[0]]), temperature=0.5)
        tensor([[-0.1429]])
    """
    _check_temperature(temperature)
    if logits.dtype not in (torch.float32, torch.float64) and logits.dim() > 1:
        # bf16/fp16: upcast one row at a time *before* dividing by the temperature, so neither the division
        # nor the log-softmax loses precision and no full-size float32 copy of the logits is made.
        rows = [selective_log_softmax(row.float() / temperature, ids) for row, ids in zip(logits, token_ids, strict=True)]
        return torch.stack(rows)
    if temperature != 1.0:
        logits = logits / temperature
    return selective_log_softmax(logits, token_ids)


def entropy_from_logits(logits: Tensor, chunk_size: int = 128) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim, computed ``chunk_size`` rows at a time (TRL).

    Entries of probability 0 (logit ``-inf``, e.g. top-k masking) contribute 0, not NaN. Computation is
    in float32 at least. Divide the logits by the temperature first if that is the distribution wanted.

    Args:
        logits: ``[..., V]`` float.
        chunk_size: rows of the flattened ``[-1, V]`` view processed at once, ``>= 1``.

    Returns:
        ``[...]`` entropies in nats, dtype ``promote(logits.dtype, float32)``.

    Raises:
        ValueError: if ``chunk_size < 1``.

    Example:
        >>> entropy_from_logits(torch.zeros(2, 4))
        tensor([1.3863, 1.3863])
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out = []
    for chunk in flat.split(chunk_size, dim=0):
        logp = F.log_softmax(chunk.to(dtype), dim=-1)
        p = logp.exp()
        plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
        out.append(-plogp.sum(-1))
    if not out:
        return flat.new_zeros(shape, dtype=dtype)
    return torch.cat(out).reshape(shape)
