"""The composed config as hyperparameters of a run, for the loggers' dashboards (W&B, TensorBoard).

The config is flattened the way Lightning's loggers flatten hyperparameters, with ``/`` between levels
(``algo/learning_rate``, ``trainer/max_steps``), so a dashboard can filter and group runs by any key. Hydra's own
node is left out; ``.hydra/config.yaml`` in the run folder has the same config as a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

SKIPPED = ("hydra",)


def flatten(tree: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """``{"algo": {"lr": 1e-3}}`` -> ``{"algo/lr": 1e-3}``; lists and scalars are leaves, an empty mapping is
    left out."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name, sep))
        else:
            flat[name] = value
    return flat


def flat_config(cfg: DictConfig) -> dict[str, Any]:
    """The composed config, resolved and flattened (:func:`flatten`), without Hydra's node. A value left ``???``
    is logged as ``???``."""
    tree = {key: OmegaConf.to_container(value, resolve=True, throw_on_missing=False)
            if OmegaConf.is_config(value) else value
            for key, value in cfg.items_ex(resolve=True) if key not in SKIPPED}
    return flatten(tree)


def log_config(loggers: Iterable[Any], cfg: DictConfig) -> None:
    """Log :func:`flat_config` with ``log_hyperparams`` to every logger but the CSV one (its run folder has
    ``.hydra/config.yaml``). Lightning's loggers write on rank 0 only."""
    from lightning.pytorch.loggers import CSVLogger

    loggers = [lg for lg in loggers if not isinstance(lg, CSVLogger)]
    if loggers:
        params = flat_config(cfg)
        for logger in loggers:
            logger.log_hyperparams(params)
