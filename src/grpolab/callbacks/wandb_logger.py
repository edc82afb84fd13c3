"""A W&B logger for runs and sweeps: automatic tags, one W&B run per job of a multirun, offline by default."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def wandb_logger(tags: Sequence[Any] = (), auto_tags: Sequence[Any] = (), **kwargs: Any) -> Any:
    """Build a :class:`~lightning.pytorch.loggers.WandbLogger` (``conf/logger/wandb.yaml``).

    A Hydra multirun runs its jobs one after another in one process, and ``WandbLogger`` would silently
    reuse a W&B run that is still open, so the previous job's run is finished first.

    Args:
        tags: the user's tags (``tags=[...]`` on the command line).
        auto_tags: tags derived from the config (``algo=...``, ``k=...``, ``i=...``, ``seed=...``), put first.
        **kwargs: ``WandbLogger`` arguments (``project``, ``group``, ``name``, ``offline``, ``save_dir``...).

    Returns:
        The logger, with the tags de-duplicated in order.
    """
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    if wandb.run is not None:
        log.info("finishing the previous W&B run %s before this job's", wandb.run.name)
        wandb.finish()
    all_tags = list(dict.fromkeys(str(t) for t in [*auto_tags, *tags]))
    return WandbLogger(tags=all_tags, **kwargs)
