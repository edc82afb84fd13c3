"""A W&B logger for runs and sweeps: automatic tags, one W&B run per job of a multirun, offline by default, the
sweep's shape on every run (group = the sweep, job_type = the arm, tags = the job's overrides), and one W&B run per
training run however often it resumes: its id is kept in the run folder (:data:`RUN_ID_FILE`) and a resume
(``ckpt_path=...``, a multirun rerun, a requeued SLURM job) continues it."""

from __future__ import annotations

import hashlib
import logging
import secrets
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AUTO = "auto"
NOT_ARM = ("seed", "logger", "tags")  # overrides that do not make an arm: the seed, where and how it is logged
MAX_GROUP, MAX_JOB_TYPE, MAX_TAG = 128, 64, 64  # W&B's limits (characters)
RUN_ID_FILE = "wandb_run_id"  # in the run folder: the id of the W&B run this training run logs to


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


def read_run_id(run_dir: Path | None) -> str | None:
    """The W&B run id kept in ``run_dir`` (:data:`RUN_ID_FILE`), or None when there is none."""
    if run_dir is None:
        return None
    try:
        return (Path(run_dir) / RUN_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def run_id(run_dir: str | Path, ckpt_path: str | Path | None = None) -> str | None:
    """The id of the W&B run a training run logs to, kept in ``run_dir`` (written atomically, rank 0 only).

    A resume (``ckpt_path`` set) continues the W&B run of the checkpoint's run folder, else of ``run_dir`` (a
    multirun job rerun into its folder, a requeued SLURM job); a fresh run, or a resume of a run that kept no id,
    gets a new one. Other ranks never create a W&B run: they get the kept id or None.
    """
    from grpolab.callbacks.resumed_run import checkpoint_run_dir, is_rank_zero, write_atomically

    run_dir = Path(run_dir)
    kept = (read_run_id(checkpoint_run_dir(ckpt_path)) or read_run_id(run_dir)) if ckpt_path else None
    if not is_rank_zero():
        return kept or read_run_id(run_dir)
    if kept:
        log.info("continuing W&B run %s (%s)", kept, RUN_ID_FILE)
    else:
        kept = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's own shape
    write_atomically(run_dir / RUN_ID_FILE, kept + "\n")
    return kept


def wandb_logger(tags: Sequence[Any] = (), auto_tags: Sequence[Any] = (), group: str | None = AUTO,
                 job_type: str | None = AUTO, override_tags: bool = True, task_name: str = "train",
                 run_dir: str | None = None, ckpt_path: str | None = None, resume: str = "allow",
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
        run_dir: the run folder, where the W&B run id is kept (:func:`run_id`); None: no id kept (a new W&B run).
        ckpt_path: the checkpoint the run resumes from: its run folder's W&B run is continued.
        resume: ``wandb.init``'s ``resume`` with a kept id: ``allow`` continues the run or starts it.
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
    if run_dir is not None and kwargs.get("id") is None:  # logger.wandb.id=... set by hand wins
        kwargs["id"] = run_id(run_dir, ckpt_path)
    if kwargs.get("id"):
        kwargs["resume"] = resume
    return WandbLogger(tags=all_tags, group=group, job_type=job_type, **kwargs)
