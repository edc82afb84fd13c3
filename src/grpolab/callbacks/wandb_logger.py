"""A W&B logger for runs and sweeps: automatic tags, one W&B run per job of a multirun, offline by default, and the
sweep's shape on every run (group = the sweep, job_type = the arm, tags = the job's overrides)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AUTO = "auto"
NOT_ARM = ("seed", "logger", "tags")  # overrides that do not make an arm: the seed, where and how it is logged
MAX_GROUP, MAX_JOB_TYPE, MAX_TAG = 128, 64, 64  # W&B's limits (characters)


def _cut(text: str, limit: int) -> str:
    """``text``, or its head and a short hash of the whole when longer than ``limit`` (distinct arms stay distinct)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 9]}~{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def sweep_metadata(hydra_cfg: Any, task_name: str) -> dict[str, Any]:
    """The W&B ``group``, ``job_type`` and override ``tags`` of a job, from Hydra's config of the run.

    - ``group``: the sweep, ``<task_name>-<name of hydra.sweep.dir>`` in a multirun (the same on a rerun into the
      same folder), ``<task_name>-<name of hydra.run.dir>`` for a single run;
    - ``job_type``: the arm, the job's overrides minus ``seed``, ``logger*``, ``tags`` and the path keys Hydra leaves out of folder names
      (``hydra.job.config.override_dirname.exclude_keys``), sorted, ``key=value`` joined with ``,``; ``default``
      when none are left;
    - ``tags``: every override but those path keys, ``key=value``.

    Values longer than W&B allows are cut and end with a hash of the whole.

    Args:
        hydra_cfg: ``HydraConfig.get()`` (``mode``, ``sweep.dir``, ``run.dir``, ``overrides.task``,
            ``job.config.override_dirname.exclude_keys``).
        task_name: the config's ``task_name``.
    """
    from hydra.types import RunMode

    folder = hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else hydra_cfg.run.dir
    excluded = set(hydra_cfg.job.config.override_dirname.exclude_keys or [])
    overrides = [str(o) for o in hydra_cfg.overrides.task]
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in excluded]
    arm = sorted(o for o in kept if o.split("=", 1)[0].lstrip("+~").split(".")[0] not in NOT_ARM)
    return {"group": _cut(f"{task_name}-{Path(str(folder)).name}", MAX_GROUP),
            "job_type": _cut(",".join(arm), MAX_JOB_TYPE) if arm else "default",
            "tags": [_cut(o, MAX_TAG) for o in kept]}


def wandb_logger(tags: Sequence[Any] = (), auto_tags: Sequence[Any] = (), group: str | None = AUTO,
                 job_type: str | None = AUTO, override_tags: bool = True, task_name: str = "train",
                 **kwargs: Any) -> Any:
    """Build a :class:`~lightning.pytorch.loggers.WandbLogger` (``conf/logger/wandb.yaml``).

    A run that is still open (an earlier job of this process) is finished first, so ``WandbLogger`` never
    silently reuses it.

    Args:
        tags: the user's tags (``tags=[...]`` on the command line).
        auto_tags: tags derived from the config (``algo=...``, ``k=...``, ``i=...``, ``seed=...``), put first.
        group: the W&B group; ``auto``: the sweep (:func:`sweep_metadata`).
        job_type: the W&B job type; ``auto``: the arm (:func:`sweep_metadata`).
        override_tags: add the job's overrides as tags (``seed=1``, ``algo=grpo_offpolicy``).
        task_name: the config's ``task_name`` (the group's first part).
        **kwargs: other ``WandbLogger`` arguments (``project``, ``name``, ``offline``, ``save_dir``...).

    Returns:
        The logger, with the tags de-duplicated in order. Outside Hydra ``auto`` gives no group or job type.
    """
    import wandb
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.loggers import WandbLogger

    if wandb.run is not None:
        log.info("finishing the previous W&B run %s before this job's", wandb.run.name)
        wandb.finish()
    meta = sweep_metadata(HydraConfig.get(), task_name) if HydraConfig.initialized() else {}
    group = meta.get("group") if group == AUTO else group
    job_type = meta.get("job_type") if job_type == AUTO else job_type
    extra = meta.get("tags", []) if override_tags else []
    all_tags = list(dict.fromkeys(str(t) for t in [*auto_tags, *extra, *tags]))
    return WandbLogger(tags=all_tags, group=group, job_type=job_type, **kwargs)
