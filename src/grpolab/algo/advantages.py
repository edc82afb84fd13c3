"""Group-relative advantages (docs/guide/objective.md#advantages).

Groups are keyed by the *value* of ``group_ids`` (the prompt uid), never by row position, so rows may
come in any order (docs/guide/pitfalls.md #2). A NaN reward means "unscorable / excluded": the row gets advantage 0
and does not enter its group's mean or std (docs/guide/pitfalls.md #11).

Zero variance: a group is "zero-std" when it has fewer than 2 valid rewards, or all of them are exactly equal
(``zero_std_threshold = 0``, the default), or its std is at most ``zero_std_threshold`` (``algo.zero_std_threshold``,
for non-binary rewards whose near-constant groups carry only noise). A zero-std group's advantages are 0.

Std convention: the standard deviation is unbiased (ddof = 1) as in TRL, and the paper's variance floor
is used, ``A = (r - mean_g) / sqrt(std_g**2 + epsilon)``. TRL instead divides by ``std_g + 1e-4``; the two
agree to about ``epsilon / (2 * std_g**2)`` relative (1e-4 for a (1, 0) group). To reproduce TRL's numbers
compute ``(r - group_mean) / (group_std + 1e-4)`` from the returned statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class AdvantageResult:
    """Per-row output of :func:`compute_advantages`; every field has shape ``[N]``.

    Attributes:
        advantages: float, 0 for excluded (NaN-reward) rows and for zero-std groups.
        group_mean: float, mean of the valid rewards of the row's group (0 if it has none).
        group_std: float, unbiased std of the valid rewards of the row's group (0 if fewer than 2).
        group_valid_count: long, number of valid (non-NaN) rewards in the row's group.
        zero_std: bool, the group has fewer than 2 valid rewards or all of them are equal.
    """

    advantages: Tensor
    group_mean: Tensor
    group_std: Tensor
    group_valid_count: Tensor
    zero_std: Tensor


@dataclass
class _GroupStats:
    inverse: Tensor  # [N] long, row -> group index
    unique_ids: Tensor  # [G]
    valid: Tensor  # [N] bool
    count: Tensor  # [G] long
    mean: Tensor  # [G] float
    std: Tensor  # [G] float
    zero_std: Tensor  # [G] bool


def _check_inputs(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape [N], got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a floating tensor (NaN = excluded), got {rewards.dtype}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def _group_stats(rewards: Tensor, group_ids: Tensor, zero_std_threshold: float = 0.0) -> _GroupStats:
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(dtype)
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = unique_ids.numel()
    valid = ~torch.isnan(r)
    r0 = torch.where(valid, r, torch.zeros_like(r))
    count = torch.zeros(num_groups, dtype=torch.long, device=r.device).index_add_(0, inverse, valid.long())
    total = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(0, inverse, r0)
    mean = total / count.clamp(min=1).to(dtype)
    dev = torch.where(valid, r - mean[inverse], torch.zeros_like(r))
    sq = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(0, inverse, dev * dev)
    std = torch.where(count >= 2, (sq / (count - 1).clamp(min=1).to(dtype)).sqrt(), torch.zeros_like(sq))
    # Exact equality test via max == min, so float round-off in the std never un-masks a constant group.
    inf = torch.full((num_groups,), float("inf"), dtype=dtype, device=r.device)
    gmax = (-inf).scatter_reduce(0, inverse, torch.where(valid, r, -torch.inf), reduce="amax")
    gmin = inf.scatter_reduce(0, inverse, torch.where(valid, r, torch.inf), reduce="amin")
    zero_std = (count < 2) | (gmax == gmin)
    if zero_std_threshold > 0:
        zero_std = zero_std | (std <= zero_std_threshold)
    return _GroupStats(inverse, unique_ids, valid, count, mean, std, zero_std)


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    scale_rewards: str = "group",
    epsilon: float = 1e-4,
    zero_std_threshold: float = 0.0,
) -> AdvantageResult:
    """Group-normalised advantages (paper eq. in §1.2 / §2.1).

    Args:
        rewards: ``[N]`` float; NaN marks an unscorable or excluded row.
        group_ids: ``[N]`` integer prompt uid; rows with equal id form a group (any order).
        scale_rewards: ``"group"``: ``(r - mean_g) / sqrt(std_g**2 + epsilon)`` (the paper);
            ``"batch"``: ``(r - mean_g) / sqrt(std_batch**2 + epsilon)`` with the unbiased std of all
            valid rewards of the batch (TRL's ``scale_rewards="batch"``); ``"none"``: ``r - mean_g``
            (Dr. GRPO).
        epsilon: variance floor ``>= 0`` (config ``algo.advantage_epsilon``).
        zero_std_threshold: ``>= 0`` (config ``algo.zero_std_threshold``); a group whose unbiased std is at
            most this is zero-std (advantages 0). 0 means all valid rewards exactly equal.

    Returns:
        :class:`AdvantageResult`; advantages are in ``promote(rewards.dtype, float32)``, exactly 0 and
        finite for excluded rows and zero-std groups (docs/guide/pitfalls.md #1), whatever ``scale_rewards``.

    Raises:
        ValueError: on shape/dtype mismatch, unknown ``scale_rewards``, negative ``epsilon`` or
            ``zero_std_threshold``.

    Example:
        >>> res = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([7, 9, 7, 9]))
        >>> [round(a, 4) for a in res.advantages.tolist()]
        [0.707, 0.0, -0.707, 0.0]
    """
    _check_inputs(rewards, group_ids)
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"algo.scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if not epsilon >= 0:
        raise ValueError(f"algo.advantage_epsilon must be >= 0, got {epsilon}")
    if not zero_std_threshold >= 0:
        raise ValueError(f"algo.zero_std_threshold must be >= 0, got {zero_std_threshold}")
    st = _group_stats(rewards, group_ids, zero_std_threshold)
    r = rewards.to(st.mean.dtype)
    inv = st.inverse
    centred = r - st.mean[inv]
    if scale_rewards == "group":
        adv = centred / (st.std[inv] ** 2 + epsilon).sqrt()
    elif scale_rewards == "batch":
        rv = r[st.valid]
        batch_std = rv.std() if rv.numel() >= 2 else r.new_zeros(())
        adv = centred / (batch_std**2 + epsilon).sqrt()
    else:
        adv = centred
    zero = st.zero_std[inv]
    adv = torch.where(zero | ~st.valid, torch.zeros_like(adv), adv)
    return AdvantageResult(
        advantages=adv,
        group_mean=st.mean[inv],
        group_std=st.std[inv],
        group_valid_count=st.count[inv],
        zero_std=zero,
    )


def group_reward_summary(rewards: Tensor, group_ids: Tensor, zero_std_threshold: float = 0.0) -> dict[str, Tensor]:
    """Per-GROUP statistics for logging the masked fraction (docs/guide/objective.md#diagnostics).

    Args:
        rewards: ``[N]`` float, NaN = excluded.
        group_ids: ``[N]`` integer prompt uid.
        zero_std_threshold: as in :func:`compute_advantages`.

    Returns:
        Dict of ``[G]`` tensors, groups ordered by sorted id: ``group_ids``, ``count`` (long, valid rows),
        ``mean``, ``std`` (unbiased, 0 with < 2 valid rows), ``zero_std`` (bool), ``all_correct`` (zero std
        and every valid reward == 1.0, the maximum reward), ``all_wrong`` (zero std and every valid reward
        == 0). A group with no valid row is zero-std but neither all-correct nor all-wrong.

    Raises:
        ValueError: on shape/dtype mismatch.
    """
    _check_inputs(rewards, group_ids)
    st = _group_stats(rewards, group_ids, zero_std_threshold)
    has = st.count > 0
    return {
        "group_ids": st.unique_ids,
        "count": st.count,
        "mean": st.mean,
        "std": st.std,
        "zero_std": st.zero_std,
        "all_correct": st.zero_std & has & ((st.mean - 1.0).abs() <= 1e-6),
        "all_wrong": st.zero_std & has & (st.mean.abs() <= 1e-6),
    }


def rows_in_loss(
    rewards: Tensor,
    group_ids: Tensor,
    completion_mask: Tensor,
    truncated: Tensor,
    *,
    scale_rewards: str = "group",
    epsilon: float = 1e-4,
    zero_std_threshold: float = 0.0,
    mask_zero_std_groups: bool = False,
    mask_truncated_completions: bool = False,
) -> tuple[AdvantageResult, Tensor]:
    """Advantages and the loss mask of one minibatch: a row out of the loss is out of its group's baseline.

    A row leaves the loss (and so its group's mean and std, and the batch std of ``scale_rewards="batch"``)
    when its reward is NaN (unscorable) or, with ``mask_truncated_completions``, when it never stopped
    (docs/guide/pitfalls.md #11). With ``mask_zero_std_groups`` the zero-std groups of the remaining rows
    also leave the loss (the paper's ``1{sigma != 0}``); they stay in nothing else (their advantages are 0).

    Args:
        rewards: ``[B]`` float, NaN = unscorable.
        group_ids: ``[B]`` integer prompt uid.
        completion_mask: ``[B, L]`` bool or 0/1.
        truncated: ``[B]`` bool, the row never sampled a stop token.
        scale_rewards, epsilon, zero_std_threshold: as in :func:`compute_advantages`.
        mask_zero_std_groups, mask_truncated_completions: ``algo.<same name>``.

    Returns:
        ``(advantages, loss_mask)``: the :class:`AdvantageResult` computed without the excluded rows, and the
        ``[B, L]`` float 0/1 loss mask.

    Raises:
        ValueError: on shape mismatch (and as :func:`compute_advantages`).

    Example:
        >>> adv, keep = rows_in_loss(torch.tensor([0.0, 1.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long),
        ...                          torch.ones(4, 2), torch.tensor([True, False, False, False]),
        ...                          scale_rewards="none", mask_truncated_completions=True)
        >>> [round(a, 3) for a in adv.advantages.tolist()], keep[:, 0].tolist()
        ([0.0, 0.667, -0.333, -0.333], [0.0, 1.0, 1.0, 1.0])
    """
    if completion_mask.dim() != 2 or completion_mask.shape[0] != rewards.shape[0] or truncated.shape != rewards.shape:
        raise ValueError(f"completion_mask must be [B, L] and truncated [B] with B = {rewards.shape[0]}, got "
                         f"{tuple(completion_mask.shape)} and {tuple(truncated.shape)}")
    excluded = torch.isnan(rewards)
    if mask_truncated_completions:
        excluded = excluded | truncated.bool()
    baseline = torch.where(excluded, torch.full_like(rewards, float("nan")), rewards)
    adv = compute_advantages(baseline, group_ids, scale_rewards, epsilon, zero_std_threshold)
    keep = completion_mask.float() * (~excluded).float()[:, None]
    if mask_zero_std_groups:
        keep = keep * (~adv.zero_std).float()[:, None]
    return adv, keep
