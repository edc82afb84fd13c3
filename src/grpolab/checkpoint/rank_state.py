"""Per-rank state in a checkpoint: under DDP/FSDP each rank trains its own rows, so some of its state is its own.

The module's: its anchor log-probs (``log pi_k`` at a minibatch's first use), its running token count, the drift it
measured and the served minibatch's log-ratios (:data:`RANK_LISTS`). The data module's: its buffer, its buffer in flight and its counters
(:data:`ROLLOUT_RANK_KEYS`). Each is gathered into the checkpoint when it is written (:func:`gather_rank_state`, a
collective) and each rank takes its own entry back at resume; the top level holds the saving rank's own values
(rank 0's in the file).
"""

from __future__ import annotations

from typing import Any

import torch

# the module's per-rank values and the checkpoint keys that list them, one entry per rank
RANK_LISTS = {"anchors": "anchor_ranks", "num_tokens": "num_tokens_ranks", "drift": "drift_ranks",
              "served": "served_ranks"}
# the data module's per-rank entries (in ``ranks``, one dict per rank)
ROLLOUT_RANK_KEYS = ("buffer", "in_flight", "counters")


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (in dicts, lists and tuples) moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def gather_rank_state(local: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's ``local``, the other ranks' tensors on the CPU, or None in one process.

    A collective (``torch.distributed.all_gather_object``): every rank must call it (Lightning calls
    ``on_save_checkpoint`` and the data module's ``state_dict`` on every rank). This rank's entry is ``local`` itself,
    so the file stores its tensors once.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, to_cpu(local))
    gathered[dist.get_rank()] = local
    return gathered


def rank_lists(local: dict[str, Any]) -> dict[str, list | None]:
    """The module's :data:`RANK_LISTS` entries of a checkpoint: every rank's value of each key of ``local`` (None in
    one process). A collective: see :func:`gather_rank_state`."""
    ranks = gather_rank_state(local)
    return {RANK_LISTS[k]: None if ranks is None else [r[k] for r in ranks] for k in local}


def own_rank_state(state: dict[str, Any], rank: int, world: int) -> tuple[dict, int, Any, Any]:
    """This rank's ``(anchors, num_tokens, drift, served)`` from a checkpoint's ``grpolab`` entry.

    Saved by several processes (``anchor_ranks``, ...): this rank's own. With another process count no anchors are
    taken (``resume_conflicts`` refuses such a resume while buffer steps remain, and then no anchor is read), rank 0
    takes the total token count, so the logged sum over ranks is kept, and every rank the drift and the served
    log-ratios of the saving process 0. Saved by one process (or by an older version): the top-level values; a
    checkpoint older than the module's drift has none (None: the data module's saved one is read,
    :meth:`~grpolab.rollout.rules.drift.DriftRefresh.load_old_layout`), one older than the served log-ratios none
    either (None: a rule that reads them waits a step).
    """
    ranks, counts, drifts, served = (state.get(RANK_LISTS[k]) for k in ("anchors", "num_tokens", "drift", "served"))
    anchors = (ranks[rank] if len(ranks) == world else {}) if ranks else state.get("anchors", {})
    if counts:
        tokens = counts[rank] if len(counts) == world else (sum(counts) if rank == 0 else 0)
    else:
        tokens = state.get("num_tokens", 0)
    drift = drifts[rank] if drifts and len(drifts) == world else state.get("drift")
    own_served = served[rank] if served and len(served) == world else state.get("served")
    return anchors, tokens, drift, own_served


def with_rollout_ranks(state: dict[str, Any]) -> dict[str, Any]:
    """The data module's ``state`` with ``ranks`` added under DDP/FSDP: every rank's :data:`ROLLOUT_RANK_KEYS` (a
    collective: see :func:`gather_rank_state`). A buffer in flight is listed without its ``sampler_weights``: the same
    replicated weights on every rank, kept once, in the top level's ``in_flight``."""
    flight = state.get("in_flight")
    own = {**{k: state.get(k) for k in ROLLOUT_RANK_KEYS},
           "in_flight": None if flight is None else {k: v for k, v in flight.items() if k != "sampler_weights"}}
    ranks = gather_rank_state(own)
    return state if ranks is None else {**state, "ranks": ranks}


def own_rollout_state(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """``state`` (:func:`with_rollout_ranks`) with ``rank``'s own entries in place of the saving rank's; its buffer in
    flight gets back the top level's ``sampler_weights``. Only when the saved and current process counts agree."""
    own = dict(state["ranks"][rank])
    if own.get("in_flight") is not None:
        own["in_flight"] = {**own["in_flight"], "sampler_weights": state["in_flight"]["sampler_weights"]}
    return {**state, **own}
