"""The trainer ranks around one sampler server: which rank this is, a bounded barrier, rank 0's probe on every rank."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch


def probe_from_rank0(probe: Any, prompts: list[list[int]], temperature: float,
                     max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Rank 0's ``probe(prompts, temperature, max_tokens)`` (the server's samples and log-probs), on every rank: a
    collective (``broadcast_object_list``); ``probe`` is None on the other ranks."""
    import torch.distributed as dist

    box = [probe(prompts, temperature, max_tokens) if probe is not None else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_world() -> tuple[int, int]:
    """``(rank, world size)`` of the trainer's process group; ``(0, 1)`` without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier(timeout_s: float) -> None:
    """Every rank waits here, bounded by ``timeout_s`` on gloo (the NCCL group's own timeout otherwise)."""
    dist = torch.distributed
    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    else:
        dist.barrier()
