"""Loss aggregation (``algo.loss_type``): how per-token losses become one number, in a registry.

Each aggregation declares, beside its reduction, the two things a distributed step needs:

* ``denominator``: the normaliser over this rank's whole optimizer-step batch (all micro-batches), computed
  ONCE per step so the sum of the micro-batch losses does not depend on the split;
* ``cross_rank``: ``"local"`` (the rank's own denominator; DDP then averages the ranks' gradients) or
  ``"global"`` (the denominator summed over ranks and divided by the world size, so that after DDP's average
  the gradient is the global mean, as one process holding the whole batch would get it).

Built in, with TRL's names (``GRPOTrainer._compute_loss``):

* ``grpo``: each sequence's token mean, summed; denominator: sequences with at least one loss token; local.
* ``bnpo``: token sum; denominator: loss tokens of this rank; local.
* ``dr_grpo``: token sum; denominator: ``B * max_completion_length`` with ``B`` = ALL rows, masked ones
  included (Dr. GRPO's constant normaliser); local.
* ``dapo``: token sum; denominator: loss tokens summed over ranks, divided by the world size; global.

A new aggregation is one call::

    @register_aggregation("seq_sum", denominator=lambda mask, max_len: float(mask.shape[0]))
    def _seq_sum(per_token, mask):
        return per_token.sum()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from grpolab.errors import ConfigError

Reduce = Callable[[Tensor, Tensor], Tensor]
Denominator = Callable[[Tensor, "int | None"], float]
CROSS_RANK_RULES = ("local", "global")


@dataclass(frozen=True)
class Aggregation:
    """One registered ``algo.loss_type``.

    Attributes:
        name: the ``algo.loss_type`` value.
        reduce: ``(per_token [B, T] float, zero at masked positions; mask [B, T] bool) -> 0-dim`` sum of this
            micro-batch (divided by the step denominator afterwards).
        denominator: ``(mask [B, T] bool of the whole step batch, max_completion_length) -> float`` on one rank.
        cross_rank: ``"local"`` or ``"global"`` (see the module docstring).
        requires: ``algo.<key>`` names that must be set (not null) for this aggregation.
    """

    name: str
    reduce: Reduce
    denominator: Denominator
    cross_rank: str = "local"
    requires: tuple[str, ...] = ()


AGGREGATIONS: dict[str, Aggregation] = {}


def register_aggregation(name: str, *, denominator: Denominator, cross_rank: str = "local",
                         requires: tuple[str, ...] = ()) -> Callable[[Reduce], Reduce]:
    """Decorator registering ``reduce`` as ``algo.loss_type=<name>`` (see :class:`Aggregation`).

    Raises:
        ValueError: ``name`` already registered, or ``cross_rank`` not in ``("local", "global")``.
    """
    if name in AGGREGATIONS:
        raise ValueError(f"algo.loss_type {name!r} is already registered")
    if cross_rank not in CROSS_RANK_RULES:
        raise ValueError(f"cross_rank must be one of {CROSS_RANK_RULES}, got {cross_rank!r}")

    def decorator(reduce: Reduce) -> Reduce:
        AGGREGATIONS[name] = Aggregation(name, reduce, denominator, cross_rank, tuple(requires))
        return reduce

    return decorator


def get_aggregation(name: str) -> Aggregation:
    """The registered aggregation called ``name``.

    Raises:
        ValueError: naming ``algo.loss_type`` and listing the registered names.
    """
    if name not in AGGREGATIONS:
        raise ConfigError(f"algo.loss_type must be one of {tuple(AGGREGATIONS)}, got {name!r}")
    return AGGREGATIONS[name]


# ------------------------------------------------------------------------------- built-in aggregations
def _sequences_with_tokens(mask: Tensor, max_completion_length: int | None) -> float:
    return float(mask.any(dim=1).sum().item())


def _token_count(mask: Tensor, max_completion_length: int | None) -> float:
    return float(mask.sum().item())


def _constant_length(mask: Tensor, max_completion_length: int | None) -> float:
    # Dr. GRPO's constant normaliser: every row counts, masked ones included, at the full length.
    if max_completion_length is None or max_completion_length <= 0:
        raise ValueError("algo.max_completion_length must be an int > 0 when algo.loss_type is 'dr_grpo'")
    return float(mask.shape[0] * max_completion_length)


@register_aggregation("grpo", denominator=_sequences_with_tokens)
def sequence_mean_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Sum over sequences of each sequence's token mean (an empty row contributes 0).

    Args:
        per_token: ``[B, T]`` float, 0 at masked positions.
        mask: ``[B, T]`` bool.

    Returns:
        0-dim tensor of ``per_token``'s dtype.
    """
    return (per_token.sum(1) / mask.sum(1).clamp(min=1).to(per_token.dtype)).sum()


@register_aggregation("bnpo", denominator=_token_count)
def token_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Sum over every token (``per_token`` is 0 at masked positions): ``[B, T] -> []``."""
    return per_token.sum()


register_aggregation("dr_grpo", denominator=_constant_length, requires=("max_completion_length",))(token_sum)
register_aggregation("dapo", denominator=_token_count, cross_rank="global")(token_sum)


# ------------------------------------------------------------------------------- denominators
def loss_denominator(loss_mask: Tensor, loss_type: str, max_completion_length: int | None = None) -> float:
    """Normaliser of the loss on this rank, computed ONCE over the whole optimizer-step batch.

    The registered aggregation's ``denominator`` (see the module table). Padding never enters it. A result of
    0 means every completion is masked; :func:`~grpolab.algo.losses.grpo_loss` then returns 0 with zero
    gradients.

    Args:
        loss_mask: ``[B, T]`` bool or 0/1, the final loss mask of the whole step batch.
        loss_type: a registered ``algo.loss_type``.
        max_completion_length: required for ``dr_grpo``.

    Returns:
        The denominator as a Python float (one host sync).

    Raises:
        ValueError: unknown ``loss_type`` (listing the registered ones), a non-2-D mask, or a missing
            ``max_completion_length`` for ``dr_grpo``.

    Example:
        >>> import torch
        >>> m = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
        >>> [loss_denominator(m, t, 4) for t in ("grpo", "bnpo", "dr_grpo")]
        [2.0, 3.0, 12.0]
    """
    agg = get_aggregation(loss_type)
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must have shape [B, T], got {tuple(loss_mask.shape)}")
    return agg.denominator(loss_mask.bool(), max_completion_length)


def step_denominator(loss_mask: Tensor, loss_type: str, max_completion_length: int | None, world_size: int = 1,
                     sum_over_ranks: Callable[[float], float] | None = None) -> float:
    """The loss normaliser of one optimizer step on this rank, such that DDP's gradient AVERAGE over
    ``world_size`` ranks gives TRL's gradient.

    The local :func:`loss_denominator`, then the aggregation's ``cross_rank`` rule: ``"global"`` (``dapo``)
    sums it over ranks and divides by ``world_size`` (TRL: ``num_items_in_batch / num_processes``), so after
    DDP averages the gradient is the GLOBAL token mean; ``"local"`` keeps the rank's own value.

    Args:
        loss_mask: ``[B, T]`` loss mask of this rank's step batch (all micro-batches).
        loss_type: a registered ``algo.loss_type``.
        max_completion_length: required for ``dr_grpo``.
        world_size: number of data-parallel ranks (>= 1).
        sum_over_ranks: all-reduce (sum) of a Python float across ranks; required when ``world_size > 1``
            and the rule is ``"global"``.

    Returns:
        The denominator (float >= 0) to pass to :func:`~grpolab.algo.losses.grpo_loss`.

    Raises:
        ValueError: ``world_size < 1``, or a ``"global"`` rule on several ranks without ``sum_over_ranks``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    local = loss_denominator(loss_mask, loss_type, max_completion_length)
    if get_aggregation(loss_type).cross_rank == "local" or world_size == 1:
        return local
    if sum_over_ranks is None:
        raise ValueError(f"loss_type {loss_type!r} on several ranks needs sum_over_ranks (the global token count)")
    return float(sum_over_ranks(local)) / world_size
