"""How each per-step training metric combines over data-parallel ranks (DDP / FSDP).

Every rank computes its ``train/*`` metrics on its own rows. The run logs one value per metric, the value one
process holding the whole global batch would log: a mean of per-rank means weighted by what each rank averaged
over (scored rows, completion tokens, loss tokens, groups, ...), the maximum of maxima, the minimum of minima,
the sum of counts. :data:`RULES` declares that per metric (:func:`declare` adds a plug-in's own); :func:`pack` /
:func:`unpack` put one rank's values and weights in one float64 tensor, so that one ``all_gather`` per step carries
everything, and :func:`reduce_metrics` combines the gathered ranks. Pure Python and torch (no Lightning).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import MappingProxyType

import torch
from torch import Tensor

# Weights a training step reports for each rank (what the rank's own mean was taken over).
ROWS = "rows"  # completions in the minibatch
SCORED_ROWS = "scored_rows"  # completions with a reward (not unscorable)
GROUPS = "groups"  # prompt groups in the minibatch
COMPLETION_TOKENS = "completion_tokens"  # completion tokens (completion mask)
LOSS_TOKENS = "loss_tokens"  # tokens in the loss (loss mask)
LOSS_SEQUENCES = "loss_sequences"  # completions with at least one loss token
LOSS_GROUPS = "loss_groups"  # prompt groups with at least one loss token
GRAD_WEIGHT = "grad_weight"  # sum |A| r over the active loss tokens (the loss-gradient weight)
UNMASKED_ROWS = "unmasked_rows"  # loss completions of groups with non-zero reward variance
PER_METRIC = "per_metric"  # the weight is reported under the metric's own name (e.g. per reward function)


@dataclass(frozen=True)
class Rule:
    """How one metric combines over ranks.

    Attributes:
        op: ``"mean"`` (weighted mean of the ranks' values), ``"max"``, ``"min"`` or ``"sum"``.
        weight: for ``mean``, the weight name (one of the constants above, :data:`PER_METRIC` for a weight
            reported under the metric's name) or None for a plain mean over ranks. For ``max`` / ``min``, ranks
            whose weight is 0 are left out (their value is a placeholder, e.g. a ratio of 1 over no tokens);
            None keeps every rank. Ignored for ``sum``.
    """

    op: str
    weight: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ("mean", "max", "min", "sum"):
            raise ValueError(f"Rule.op must be mean, max, min or sum, got {self.op!r}")


FALLBACK = Rule("mean", ROWS)
"""The rule of a metric :data:`RULES` does not name: a row-weighted mean."""

_MAX = Rule("max")  # a value every rank holds alike (learning rate, global grad norm, step counters) or a peak

# Exact names, and patterns with "*" (any characters, "/" included). An exact name wins over every pattern;
# among matching patterns the one with the most literal characters wins.
RULES: Mapping[str, Rule] = MappingProxyType({
    # loss: each rank's own normalised loss; DDP averages the ranks' gradients, so the run's loss is the plain
    # mean over ranks (for dapo too: each rank divides by the global token count / world size).
    "train/loss": Rule("mean"),
    "train/reward": Rule("mean", SCORED_ROWS),
    "train/reward_std": Rule("mean", GROUPS),
    "train/frac_reward_zero_std": Rule("mean", ROWS),
    "train/frac_zero_std/all_correct": Rule("mean", GROUPS),
    "train/frac_zero_std/all_wrong": Rule("mean", GROUPS),
    "train/frac_unscorable": Rule("mean", ROWS),
    "train/entropy": Rule("mean", COMPLETION_TOKENS),
    "train/completions/mean_length": Rule("mean", ROWS),
    "train/completions/clipped_ratio": Rule("mean", ROWS),
    "train/num_tokens": Rule("sum"),  # each rank's running count of its own tokens
    "train/grad_norm": _MAX,  # the norm of the all-reduced (DDP) or sharded-then-reduced (FSDP) gradient
    "train/learning_rate": _MAX,
    "train/lag": _MAX,
    "train/lag/max": _MAX,
    "train/iteration": _MAX,
    "train/sampler_refreshes": _MAX,
    # a refresh rule's own metrics (train/rollout/<name>...) are declared by the rule: declare()
    "train/rollout/sampler_restarts": _MAX,  # samplers restarted after a failure so far (one-process runs only)
    "train/skipped_steps": _MAX,  # every rank skips the same steps (the global gradient norm decides)
    "train/rewards/*": Rule("mean", PER_METRIC),  # rewards/<function>/mean over the rows it scored
    # loss statistics (grpolab.algo.losses.loss_stats_to_metrics)
    "train/clip_ratio/*": Rule("mean", LOSS_TOKENS),
    "train/ratio/mean": Rule("mean", LOSS_TOKENS),
    "train/ratio/min": Rule("min", LOSS_TOKENS),
    "train/ratio/max": Rule("max", LOSS_TOKENS),
    "train/ratio/anchor_mean": Rule("mean", LOSS_TOKENS),
    "train/ratio/anchor_max": Rule("max", LOSS_TOKENS),
    "train/ratio/anchor_frac_above_2": Rule("mean", LOSS_TOKENS),
    "train/ratio/grad_weight_frac_above_2": Rule("mean", GRAD_WEIGHT),
    # quantiles do not decompose over ranks: the loss-token weighted mean of the ranks' quantiles approximates
    # the quantile of the pooled tokens (exact when the ranks' distributions agree)
    "train/ratio/anchor_q*": Rule("mean", LOSS_TOKENS),
    "train/kl": Rule("mean", LOSS_TOKENS),
    "train/num_loss_tokens": Rule("sum"),
    # engine vs trainer log-probs over the completion tokens (grpolab.algo.sampling_correction)
    "train/sampling/sampling_logp_difference/mean": Rule("mean", COMPLETION_TOKENS),
    "train/sampling/sampling_logp_difference/max": Rule("max", COMPLETION_TOKENS),
    "train/sampling/importance_sampling_ratio/min": Rule("min", COMPLETION_TOKENS),
    "train/sampling/importance_sampling_ratio/mean": Rule("mean", COMPLETION_TOKENS),
    "train/sampling/importance_sampling_ratio/max": Rule("max", COMPLETION_TOKENS),
    # policy vs sampler (grpolab.algo.diagnostics.policy_sampler_divergence)
    "train/tv_token": Rule("mean", LOSS_TOKENS),
    "train/tv_seq": Rule("mean", LOSS_SEQUENCES),
    "train/kl_sampler_policy": Rule("mean", LOSS_SEQUENCES),
    "train/log_ratio_seq_mean": Rule("mean", LOSS_SEQUENCES),
    "train/log_ratio_seq_max": Rule("max", LOSS_SEQUENCES),
    "train/log_ratio_seq_min": Rule("min", LOSS_SEQUENCES),
    "train/c_weight/mean": Rule("mean", ROWS),
    "train/c_weight/max": Rule("max", ROWS),
    "train/c_weight/unmasked_mean": Rule("mean", UNMASKED_ROWS),
    "train/surrogate": Rule("mean", LOSS_SEQUENCES),
    # Theorem 1 at pi_{k+1}: means over the prompts in the loss (NaN on the steps it is not computed)
    "train/lower_bound": Rule("mean", LOSS_GROUPS),
    "train/lower_bound/*": Rule("mean", LOSS_GROUPS),
    # timings: the slowest rank sets the pace; throughput adds up
    "train/step_time": _MAX,
    "train/time/*": _MAX,
    "train/tokens_per_second": Rule("sum"),
    # a registered loss variant's own stats, named by loss_stats_to_metrics: <x>_sum is logged as <x>_mean per
    # loss token, <x>_min / <x>_max as they are (stats of other names are sums: they take the fallback)
    "train/*_mean": Rule("mean", LOSS_TOKENS),
    "train/*_max": Rule("max", LOSS_TOKENS),
    "train/*_min": Rule("min", LOSS_TOKENS),
})


_DECLARED: dict[str, Rule] = {}  # the rules plug-ins declared (declare()), beside RULES


def declare(rules: Mapping[str, Rule]) -> None:
    """Declare how metrics logged by a plug-in combine over ranks, beside :data:`RULES`: a refresh rule declares its
    own ``train/rollout/...`` metrics when its class is defined (:class:`~grpolab.rollout.rules.base.RefreshRule`).

    Args:
        rules: full metric name (``train/...``) or ``*`` pattern -> :class:`Rule`.

    Raises:
        ValueError: a name :data:`RULES` or an earlier declaration already gives another rule.
    """
    for name, rule in rules.items():
        if not isinstance(rule, Rule):
            raise ValueError(f"the cross-rank rule of {name!r} must be a metric_reduction.Rule, got {rule!r}")
        known = RULES.get(name, _DECLARED.get(name))
        if known is not None and known != rule:
            raise ValueError(f"metric {name!r} already combines over ranks by {known}, not {rule}: give it another name")
    _DECLARED.update(rules)
    _lookup_default.cache_clear()


def _lookup(name: str, rules: Mapping[str, Rule]) -> Rule | None:
    if name in rules:
        return rules[name]
    matches = [k for k in rules if "*" in k and fnmatchcase(name, k)]
    best = max(matches, key=lambda k: len(k.replace("*", "")), default=None)
    return rules[best] if best is not None else None


@functools.lru_cache(maxsize=4096)
def _lookup_default(name: str) -> Rule | None:
    return _lookup(name, {**RULES, **_DECLARED})  # cleared by declare(), the only change to either


def explicit_rule(name: str, rules: Mapping[str, Rule] = RULES) -> Rule | None:
    """The rule ``rules`` declares for ``name`` (its exact name, else the most specific ``*`` pattern), or None.
    With the default :data:`RULES`, what plug-ins :func:`declare` counts too.

    Lookups in :data:`RULES` are cached per name (a step's ~60 names resolve once per run).
    """
    return _lookup_default(name) if rules is RULES else _lookup(name, rules)


def rule_for(name: str, rules: Mapping[str, Rule] = RULES) -> Rule:
    """:func:`explicit_rule`, or :data:`FALLBACK` (a row-weighted mean) for a metric ``rules`` does not name."""
    return explicit_rule(name, rules) or FALLBACK


def _fingerprint(names: Sequence[str]) -> float:
    return float(zlib.crc32("\n".join(names).encode()))  # < 2**32: exact in float64


def pack(metrics: Mapping[str, float], weights: Mapping[str, float]) -> Tensor:
    """One rank's metrics and weights as one tensor for a single ``all_gather``.

    Args:
        metrics: metric name -> value (Python floats; NaN and inf allowed).
        weights: weight name -> value (>= 0).

    Returns:
        ``[len(metrics) + len(weights) + 1]`` float64 on the CPU: the metric values in sorted-name order, the
        weights in sorted-name order, then a fingerprint of all names (so :func:`unpack` can check that every
        rank reported the same names).
    """
    m, w = sorted(metrics), sorted(weights)
    return torch.tensor([*(float(metrics[k]) for k in m), *(float(weights[k]) for k in w),
                         _fingerprint([*m, "|", *w])], dtype=torch.float64)


def unpack(gathered: Tensor, metric_names: Sequence[str], weight_names: Sequence[str]
           ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Split the gathered :func:`pack` tensors of all ranks back into per-rank dicts.

    Args:
        gathered: ``[world_size, K + M + 1]`` float (row r = rank r's :func:`pack`).
        metric_names: the K metric names (any order).
        weight_names: the M weight names (any order).

    Returns:
        ``(metrics per rank, weights per rank)``, lists of ``world_size`` dicts.

    Raises:
        ValueError: if the shape does not match the names, or a rank reported other names than these.
    """
    m, w = sorted(metric_names), sorted(weight_names)
    if gathered.dim() != 2 or gathered.shape[1] != len(m) + len(w) + 1:
        raise ValueError(f"gathered must be [world_size, {len(m) + len(w) + 1}], got {tuple(gathered.shape)}")
    rows = gathered.detach().to("cpu", torch.float64).tolist()
    expected = _fingerprint([*m, "|", *w])
    bad = [r for r, row in enumerate(rows) if row[-1] != expected]
    if bad:
        raise ValueError(f"ranks {bad} logged other step metrics than this rank ({len(m)} metrics, "
                         f"{len(w)} weights): every rank must log the same names each step")
    return ([dict(zip(m, row[:len(m)], strict=True)) for row in rows],
            [dict(zip(w, row[len(m):-1], strict=True)) for row in rows])


def _weight(name: str, rule: Rule, weights: Mapping[str, float]) -> float:
    key = name if rule.weight == PER_METRIC else rule.weight
    if key not in weights:
        raise ValueError(f"metric {name!r} is reduced over ranks by the weight {key!r}, which the step did not "
                         f"report (reported: {sorted(weights)})")
    return float(weights[key])


def _extreme(values: list[float], op: str) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values) if op == "max" else min(values)


def reduce_metrics(per_rank: Sequence[Mapping[str, float]], per_rank_weights: Sequence[Mapping[str, float]],
                   rules: Mapping[str, Rule] = RULES) -> dict[str, float]:
    """Combine every rank's step metrics into the values one process with the global batch would log.

    * ``mean`` with a weight: ``sum_r w_r v_r / sum_r w_r`` over the ranks with ``w_r > 0`` (a rank that averaged
      over nothing reports a placeholder); the plain mean of all ranks when every weight is 0.
    * ``mean`` without a weight: the plain mean over ranks.
    * ``max`` / ``min``: over the ranks with a non-zero weight (every rank when none has one, or the rule names
      no weight); NaN when a value taken is NaN.
    * ``sum``: the sum over ranks.

    Args:
        per_rank: one dict per rank, metric name -> value, the same names on every rank.
        per_rank_weights: one dict per rank, weight name -> value (>= 0); holds every weight the rules of these
            metrics name (and, for :data:`PER_METRIC`, the metric's own name).
        rules: name/prefix -> :class:`Rule`; unnamed metrics use :data:`FALLBACK`.

    Returns:
        metric name -> combined float.

    Raises:
        ValueError: no ranks, ranks with different names or counts of dicts, or a weight a rule needs is missing.

    Example:
        >>> reduce_metrics([{"train/reward": 1.0}, {"train/reward": 0.0}], [{"scored_rows": 3}, {"scored_rows": 1}])
        {'train/reward': 0.75}
    """
    if not per_rank or len(per_rank) != len(per_rank_weights):
        raise ValueError(f"need one metrics dict and one weights dict per rank, got {len(per_rank)} and "
                         f"{len(per_rank_weights)}")
    names = list(per_rank[0])
    if any(set(m) != set(names) for m in per_rank[1:]):
        raise ValueError("every rank must report the same metric names")
    out: dict[str, float] = {}
    for name in names:
        rule = rule_for(name, rules)
        values = [float(m[name]) for m in per_rank]
        if rule.op == "sum":
            out[name] = math.fsum(values)
            continue
        if rule.weight is None:
            out[name] = math.fsum(values) / len(values) if rule.op == "mean" else _extreme(values, rule.op)
            continue
        weights = [_weight(name, rule, w) for w in per_rank_weights]
        kept = [(v, w) for v, w in zip(values, weights, strict=True) if w > 0]
        if not kept:
            out[name] = math.fsum(values) / len(values) if rule.op == "mean" else _extreme(values, rule.op)
        elif rule.op == "mean":
            out[name] = math.fsum(v * w for v, w in kept) / math.fsum(w for _, w in kept)
        else:
            out[name] = _extreme([v for v, _ in kept], rule.op)
    return out


WEIGHT_NAMES = (ROWS, SCORED_ROWS, GROUPS, COMPLETION_TOKENS, LOSS_TOKENS, LOSS_SEQUENCES, LOSS_GROUPS, GRAD_WEIGHT,
                UNMASKED_ROWS)
"""The weights :func:`step_weights` reports (every rule's weight is one of them or :data:`PER_METRIC`)."""


def step_weights(completion_mask: Tensor, loss_mask: Tensor, rewards: Tensor, group_ids: Tensor, zero_std: Tensor,
                 grad_weight: Tensor | float | None = None) -> dict[str, float]:
    """What one rank's step metrics were averaged over, for :func:`reduce_metrics` (one host transfer).

    Args:
        completion_mask: ``[B, T]`` bool or 0/1, the completion tokens.
        loss_mask: ``[B, T]`` float or bool, the tokens in the loss (non-zero = in).
        rewards: ``[B]`` float, NaN = unscorable.
        group_ids: ``[B]`` integer prompt group id.
        zero_std: ``[B]`` bool, the row's group has zero reward variance.
        grad_weight: the step's ``sum |A| r`` over active loss tokens (``grad_weight_sum`` of the merged loss
            statistics), or None when the loss did not compute it (then 0).

    Returns:
        Every name of :data:`WEIGHT_NAMES` -> float >= 0.

    Raises:
        ValueError: when the row counts of the tensors differ.
    """
    b = completion_mask.shape[0]
    if not (loss_mask.shape[0] == rewards.shape[0] == group_ids.shape[0] == zero_std.shape[0] == b):
        raise ValueError(f"completion_mask, loss_mask, rewards, group_ids and zero_std need the same rows, got "
                         f"{completion_mask.shape[0]}, {loss_mask.shape[0]}, {rewards.shape[0]}, "
                         f"{group_ids.shape[0]}, {zero_std.shape[0]}")
    device = completion_mask.device
    in_loss = loss_mask.to(device).bool()
    seqs = in_loss.any(1)
    ids = group_ids.to(device)
    gw = grad_weight if isinstance(grad_weight, Tensor) else torch.tensor(float(grad_weight or 0.0))
    values = torch.stack([
        torch.tensor(float(b), dtype=torch.float64, device=device),
        (~torch.isnan(rewards.to(device))).sum().double(),
        torch.tensor(float(torch.unique(ids).numel()), dtype=torch.float64, device=device),
        completion_mask.bool().sum().double(),
        in_loss.sum().double(),
        seqs.sum().double(),
        torch.tensor(float(torch.unique(ids[seqs]).numel()), dtype=torch.float64, device=device),
        gw.detach().reshape(()).to(device, torch.float64),
        (seqs & ~zero_std.to(device).bool()).sum().double(),
    ]).cpu().tolist()
    return dict(zip(WEIGHT_NAMES, values, strict=True))
