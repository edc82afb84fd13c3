"""Per-rank training state in a checkpoint: under DDP/FSDP each rank trains its own rows, so its anchor log-probs
(``log pi_k`` at a minibatch's first use) and its running token count are its own. They are gathered into the
checkpoint when it is written and each rank takes its own entry back at resume (as the rollout buffer's state is:
:mod:`grpolab.rollout.resume`)."""

from __future__ import annotations

from typing import Any


def gather_rank_state(local: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's ``local`` (e.g. ``{"anchors": ..., "num_tokens": ...}``), or None in one process.

    A collective (``torch.distributed.all_gather_object``): every rank must call it (Lightning calls
    ``on_save_checkpoint`` on every rank). This rank's entry is ``local`` itself, so the file stores its tensors once.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    gathered[dist.get_rank()] = local
    return gathered


def own_rank_state(state: dict[str, Any], rank: int, world: int) -> tuple[dict, int]:
    """This rank's ``(anchors, num_tokens)`` from a checkpoint's ``grpolab`` entry.

    Saved by several processes (``anchor_ranks``, ``num_tokens_ranks``): this rank's own. With another process count
    no anchors are taken (``resume_conflicts`` refuses such a resume while buffer steps remain, and then no anchor is
    read) and rank 0 takes the total token count, so the logged sum over ranks is kept. Saved by one process (or by an
    older version): the top-level values.
    """
    ranks, counts = state.get("anchor_ranks"), state.get("num_tokens_ranks")
    anchors = (ranks[rank] if len(ranks) == world else {}) if ranks else state.get("anchors", {})
    if counts:
        tokens = counts[rank] if len(counts) == world else (sum(counts) if rank == 0 else 0)
    else:
        tokens = state.get("num_tokens", 0)
    return anchors, tokens
