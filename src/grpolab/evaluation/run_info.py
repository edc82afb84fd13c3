"""The training run an evaluated policy comes from: find its folder, and warn when the evaluation's task differs from
the run's (another data seed splits other prompts off as held out)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grpolab.run_files import read_summary

log = logging.getLogger("grpolab.eval")


def run_folder(cfg: DictConfig) -> Path | None:
    """The training run folder the policy comes from, if it is one (it holds summary.json or .hydra/)."""
    candidates = []
    if cfg.get("ckpt_path"):
        candidates.append(Path(cfg.ckpt_path).resolve().parent.parent)
    path = OmegaConf.select(cfg, "model.path")
    if path and Path(path).exists():
        candidates.append(Path(path).resolve().parent)
    for c in candidates:
        if (c / "summary.json").is_file() or (c / ".hydra" / "config.yaml").is_file():
            return c
    return None


def check_run_data(cfg: DictConfig, run: Path) -> dict[str, Any]:
    """Compare the eval's task config with the run's; warn when they differ (a different data seed changes the
    split, so the 'test' prompts could be training prompts of that run)."""
    info: dict[str, Any] = {"run_dir": str(run)}
    s, problem = read_summary(run)  # one that cannot be read (half-written) is said, never a traceback
    if problem:
        log.warning("%s: the run's numbers are not compared", problem)
    if s is not None:
        info.update({k: s.get(k) for k in ("val_accuracy_end", "val_best_accuracy", "steps", "seed")})
        info["data_seed"] = s.get("data_seed", s.get("seed"))  # runs before data_seed split by their seed
    hydra_cfg = run / ".hydra" / "config.yaml"
    ours_seed = OmegaConf.select(cfg, "data.seed")
    if not hydra_cfg.is_file() and info.get("data_seed") is not None and ours_seed is not None:
        if int(info["data_seed"]) != int(ours_seed):  # no saved config (an in-process run): the summary tells
            log.warning("the run %s used data.seed=%s but data.seed=%s here: pass data_seed=%s so its held-out "
                        "prompts are the ones scored", run, info["data_seed"], ours_seed, info["data_seed"])
            info["data_differs"] = ["seed"]
    if hydra_cfg.is_file():
        run_cfg = OmegaConf.load(hydra_cfg)
        try:
            theirs = OmegaConf.to_container(run_cfg.data, resolve=True)
        except Exception:  # an interpolation that only resolves inside the run (e.g. hydra:...)
            theirs = OmegaConf.to_container(run_cfg.data, resolve=False)
        ours = OmegaConf.to_container(cfg.data, resolve=True)
        if theirs != ours:
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            log.warning("the task config differs from the run's (%s) in %s: pass the run's overrides "
                        "(e.g. data_seed=%s) so its held-out prompts are the ones scored", run, diff,
                        OmegaConf.select(run_cfg, "data.seed"))
            info["data_differs"] = diff
    return info
