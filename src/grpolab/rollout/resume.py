"""The rollout side's checkpoint: what it saves, and which settings shape a saved buffer.

A resume with a buffer-shaping setting changed is refused (or drops the buffer with ``resume_drop_buffer``).

A checkpoint taken mid-buffer holds the rest of that buffer: completions sampled with the old
``max_completion_length`` and ``temperature``, grouped by the old ``num_generations``, split into the old
``steps_per_generation`` minibatches of ``per_device_train_batch_size``, with advantages and loss masks
already computed under the old advantage settings, and sampler/reference log-probs present or not. Mixing
that with new settings trains on a buffer the new settings never produced.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from grpolab.errors import ConfigError
from grpolab.rollout.buffer import RolloutBuffer

log = logging.getLogger(__name__)

# algo.<key> values stored with the buffer and compared on resume.
BUFFER_SETTINGS = (
    "num_generations",
    "per_device_train_batch_size",
    "steps_per_generation",
    "num_iterations",
    "max_completion_length",
    "temperature",
    "scale_rewards",
    "advantage_epsilon",
    "mask_zero_std_groups",
    "mask_truncated_completions",
    "truncated_reward",
    "zero_std_threshold",
    "beta",
)


def buffer_settings(cfg: Any) -> dict[str, Any]:
    """The :data:`BUFFER_SETTINGS` of a :class:`~grpolab.config.GRPOConfig`, as plain values."""
    return {key: getattr(cfg, key) for key in BUFFER_SETTINGS if hasattr(cfg, key)}


def changed_buffer_settings(saved: dict[str, Any] | None, cfg: Any) -> list[str]:
    """``"algo.<key>: <saved> -> <now>"`` for every buffer setting that differs from the checkpoint's.

    ``beta`` counts as changed only when it moves between 0 and > 0 (the buffer holds reference
    log-probs exactly when beta > 0; its value only weights the loss). A checkpoint without saved
    settings (older format) is not checked.
    """
    if not saved:
        return []
    now = buffer_settings(cfg)
    out = []
    for key, old in saved.items():
        if key not in now:
            continue
        new = now[key]
        if key == "beta":
            differs = (float(old or 0) > 0) != (float(new or 0) > 0)
        else:
            differs = old != new
        if differs:
            out.append(f"algo.{key}: {old!r} -> {new!r}")
    return out


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def gather_rank_states(local: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    """Every rank's ``local`` (its own ``buffer``, ``in_flight``, ``counters`` and ``drift``: under DDP/FSDP each rank samples
    its own prompts), on every rank, with tensors moved to the CPU.

    A collective (``torch.distributed.all_gather_object``): every rank must call it. ``in_flight`` is
    gathered without its ``sampler_weights`` (the same replicated weights on every rank; the checkpoint
    keeps rank 0's copy at the top level). This rank's entry is ``local`` itself, so a checkpoint pickles
    it once.
    """
    import torch.distributed as dist

    def strip(entry: dict[str, Any]) -> dict[str, Any]:
        flight = entry.get("in_flight")
        return {**entry, "in_flight": None if flight is None else {k: v for k, v in flight.items()
                                                                    if k != "sampler_weights"}}

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, _to_cpu(strip(local)))
    gathered[rank] = strip(local)
    return gathered


def saved_world_size(state: dict[str, Any]) -> int:
    """How many processes wrote a rollout state (1 for a checkpoint without per-rank entries)."""
    return len(state["ranks"]) if state.get("ranks") else 1


def rank_state(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """``rank``'s entry of a multi-process checkpoint (``state["ranks"]``, from :func:`gather_rank_states`); its
    in-flight spec gets back the top level's ``sampler_weights``. Call it only when the saved and current world
    sizes agree.
    """
    entry = dict(state["ranks"][rank])
    if entry.get("in_flight") is not None:
        entry["in_flight"] = {**entry["in_flight"], "sampler_weights": state["in_flight"]["sampler_weights"]}
    return entry


def rollout_state(dm: Any, rank: int, world: int) -> dict[str, Any]:
    """The rollout state of a :class:`~grpolab.rollout.datamodule.RolloutDataModule` for exact resume.

    Under DDP/FSDP every rank holds its own buffer (disjoint prompts): they are gathered into ``ranks`` (one entry
    per rank, tensors on the CPU; :func:`gather_rank_states`), a collective: call it on every rank, as Lightning's
    ``Trainer.save_checkpoint`` does. The top level holds this rank's own entry (rank 0's in the file).
    """
    refresh = dm.refresh.state_dict() if dm.refresh else {"in_flight": None}
    buffer = dm.buffer.state_dict()
    # per rank: each rank's own buffer and counters, and the drift it measured on its own rows (adaptive refresh)
    local = {"buffer": buffer.pop("buffer"), "in_flight": refresh.pop("in_flight"),
             "counters": dict(dm.producer.counters) if dm.producer else {},
             "drift": dm.models.drift if dm.models else None}
    state = {"prompt_order": dm.prompts.state_dict() if dm.prompts else None, **local, **buffer, **refresh,
             **dm.sampler.state_dict(), "ref_refreshed_at": dm.ref_refreshed_at, "settings": buffer_settings(dm.cfg),
             "drift_refresh": dm.drift_refresh.state_dict()}
    if world > 1:
        state["ranks"] = gather_rank_states(local, rank, world)
    return state


def resume_conflicts(state: dict[str, Any], cfg: Any, world: int, drop_buffer: bool) -> list[str]:
    """What keeps a saved rollout state from being resumed as it is: every changed buffer setting (see
    :func:`changed_buffer_settings`) and a process count other than the one that saved buffers with steps left
    (each rank held its own prompts' buffer).

    Args:
        state: the data module's saved state (:func:`rollout_state`).
        cfg: the :class:`~grpolab.config.GRPOConfig` of the resumed run.
        world: the number of training processes now.
        drop_buffer: ``resume_drop_buffer``: the conflicts are returned (the caller drops the buffer) instead of raised.

    Raises:
        ConfigError: listing the conflicts and naming ``resume_drop_buffer``, when there are any and not ``drop_buffer``.
    """
    changed = changed_buffer_settings(state.get("settings"), cfg)
    saved_world = saved_world_size(state)
    saved_i = (state.get("settings") or {}).get("num_iterations", cfg.num_iterations)
    pending = RolloutBuffer.saved_has_pending(state, saved_i) or state.get("in_flight") is not None
    if saved_world != world and pending:  # each rank held its own buffer
        changed = [*changed, f"rank buffers in the checkpoint: {saved_world}, processes now: {world}"]
    if changed and not drop_buffer:
        raise ConfigError(
            "resuming with settings that shape the saved rollout buffer changed: " + ", ".join(changed)
            + ". Resume with the checkpoint's values, or pass resume_drop_buffer=true to drop the saved buffer "
            "and sample a new one with the new settings"
        )
    return changed


def load_rollout_state(dm: Any, state: dict[str, Any], rank: int, world: int) -> None:
    """Restore :func:`rollout_state` into ``dm`` (after its ``setup``).

    Raises:
        ValueError: a setting that shapes the saved buffer changed (listing them), or the process count changed
            while steps of the saved buffers remain, unless ``dm.resume_drop_buffer``; or the checkpoint holds a
            buffer in flight and ``rollout.async_generation`` is off.
    """
    if state.get("prompt_order") or state.get("sampler"):
        dm.prompts.load_state_dict(state.get("prompt_order") or state["sampler"])
    changed = resume_conflicts(state, dm.cfg, world, dm.resume_drop_buffer)
    saved_world = saved_world_size(state)
    if changed:
        log.warning("resume_drop_buffer=true: dropping the saved rollout buffer (%s); the next step samples "
                    "a new one", ", ".join(changed))
    if not changed and world > 1 and saved_world == world:
        state = {**state, **rank_state(state, rank)}  # this rank's own buffer (DDP: disjoint prompts)
    dm.buffer.load_state_dict(state, keep_minibatches=not changed)
    dm.sampler.load_state_dict(state, default_pushes=state["rounds"])
    dm.refresh.load_state_dict(state, None if changed else state.get("in_flight"))
    dm.ref_refreshed_at = state.get("ref_refreshed_at", 0)
    dm.drift_refresh.load_state_dict(state.get("drift_refresh") or {})
    if dm.models is not None:
        dm.models.drift = state.get("drift")
    dm.producer.counters.update(state.get("counters", {}))


def rollout_summary(dm: Any) -> dict[str, Any]:
    """The rollout side's counters of a data module, for ``summary.json``: refreshes, weight pushes (count and
    seconds), generation and rollout seconds, training completion counts (this rank's), validation completion counts
    (every rank validates the whole held-out set) and rows skipped as unscorable."""
    refresh, counters = dm.refresh, dm.producer.counters
    return {"sampler_refreshes": int(dm.buffer.rounds), "weight_syncs": int(dm.sampler.pushes),
            "time_weight_sync_s": round(dm.sampler.push_time_s, 4), "async_generation": dm.settings.async_generation,
            "time_generation_s": round(refresh.time_generation_s if refresh else 0.0, 2),
            "time_rollout_s": round(refresh.time_rollout_s if refresh else 0.0, 2),
            **{k: counters.get(k, 0) for k in ("completions", "unscorable", "truncated")},
            **{f"val_{k}": dm.validation_producer.counters.get(k, 0) for k in ("completions", "unscorable")},
            "skipped_unscorable_rows": dict(dm.skipped_rows), **dm.drift_refresh.summary()}
