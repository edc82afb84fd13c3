"""Which settings shape a saved rollout buffer, so a resume with them changed is refused (or drops it).

A checkpoint taken mid-buffer holds the rest of that buffer: completions sampled with the old
``max_completion_length`` and ``temperature``, grouped by the old ``num_generations``, split into the old
``steps_per_generation`` minibatches of ``per_device_train_batch_size``, with advantages and loss masks
already computed under the old advantage settings, and sampler/reference log-probs present or not. Mixing
that with new settings trains on a buffer the new settings never produced.
"""

from __future__ import annotations

from typing import Any

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
