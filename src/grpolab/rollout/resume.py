"""Which settings shape a saved rollout buffer, and whether a resumed run can serve it.

The data module composes its checkpoint from its parts' states
(:meth:`~grpolab.rollout.datamodule.RolloutDataModule.state_dict`) and stores the :data:`BUFFER_SETTINGS` with
them. A resume with a buffer-shaping setting changed is refused (or drops the buffer with ``resume_drop_buffer``).

A checkpoint taken mid-buffer holds the rest of that buffer: completions sampled with the old
``max_completion_length`` and ``temperature``, grouped by the old ``num_generations``, split into the old
``steps_per_generation`` minibatches of ``per_device_train_batch_size``, with advantages and loss masks
already computed under the old advantage settings, and sampler/reference log-probs present or not. Mixing
that with new settings trains on a buffer the new settings never produced.
"""

from __future__ import annotations

import logging
from typing import Any

from grpolab.checkpoint.rank_state import own_rollout_state
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


def saved_world_size(state: dict[str, Any]) -> int:
    """How many processes wrote a rollout state (1 for a checkpoint without per-rank entries)."""
    return len(state["ranks"]) if state.get("ranks") else 1


def resume_conflicts(state: dict[str, Any], cfg: Any, world: int, drop_buffer: bool) -> list[str]:
    """What keeps a saved rollout state from being resumed as it is: every changed buffer setting (see
    :func:`changed_buffer_settings`) and a process count other than the one that saved buffers with steps left
    (each rank held its own prompts' buffer).

    Args:
        state: the data module's saved state (:meth:`~grpolab.rollout.datamodule.RolloutDataModule.state_dict`).
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


def resumable_state(state: dict[str, Any], cfg: Any, rank: int, world: int,
                    drop_buffer: bool) -> tuple[dict[str, Any], bool]:
    """The saved rollout state as this rank resumes it, and whether its buffers are kept.

    Args:
        state: the data module's saved state.
        cfg: the :class:`~grpolab.config.GRPOConfig` of the resumed run.
        rank, world: this process and the process count now.
        drop_buffer: ``resume_drop_buffer``: drop a saved buffer that :func:`resume_conflicts` finds, instead of
            refusing.

    Returns:
        ``(state, keep)``: with this rank's own entries when the process count is the saved one
        (:func:`~grpolab.checkpoint.rank_state.own_rollout_state`) and the prompt order under ``prompt_order`` (older
        checkpoints named it ``sampler``); ``keep`` is False when the saved buffers are dropped.

    Raises:
        ConfigError: as :func:`resume_conflicts`.
    """
    changed = resume_conflicts(state, cfg, world, drop_buffer)
    if changed:
        log.warning("resume_drop_buffer=true: dropping the saved rollout buffer (%s); the next step samples "
                    "a new one", ", ".join(changed))
    elif world > 1 and saved_world_size(state) == world:
        state = own_rollout_state(state, rank)  # this rank's own buffer (DDP: disjoint prompts)
    return {**state, "prompt_order": state.get("prompt_order") or state.get("sampler")}, not changed
