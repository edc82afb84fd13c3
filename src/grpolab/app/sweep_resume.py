"""Multiruns that resume: rerunning the same ``-m`` command into the same sweep folder skips the finished jobs and
resumes the interrupted ones.

A multirun job's folder is ``<hydra.sweep.dir>/<num>_<overrides>`` (``conf/hydra/default.yaml``): the same command
with the same ``hydra.sweep.dir=...`` gives every job the folder it had before (``hydra.job.chdir`` is false and
the name holds no time stamp). At the start of each job (:func:`resume_or_skip`, from ``src/train.py``):

- **finished** (``summary.json`` with ``"interrupted": false``, not failed, ``steps`` >= ``trainer.max_steps`` and
  the final eval's score when ``final_eval.enabled``: :func:`grpolab.app.run_files.run_status`): the job
  logs one line and returns the saved summary, so the multirun counts it as a success; nothing in its folder is
  written again except Hydra's own ``.hydra/*.yaml`` (the same composed config), one line in ``train.log``
  and the pid in ``.run.lock`` (:mod:`grpolab.app.run_identity`).
- **interrupted** (no finished summary, ``checkpoints/last.ckpt`` present: Ctrl-C, SIGTERM, a killed process
  after a periodic checkpoint): ``ckpt_path`` is set to that checkpoint, and the run resumes exactly (the same
  path as ``ckpt_path=...`` by hand). ``metrics.csv`` is kept whole: the rows before the checkpoint are set aside
  (``metrics.before_resume.csv``) while Lightning's CSV logger starts its file anew, and put back in front of the
  new rows when the run ends (:func:`stitch_metrics`).
- anything else (not started, failed before a checkpoint): the job runs from the start.

A run that sets ``ckpt_path=`` itself, and a single run (not ``-m``), are left alone. :func:`job_state` is what
``sweeps/sweep_status.py`` reports per job folder.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from grpolab.app.run_files import RunStatus, read_config, run_status, write_csv

log = logging.getLogger("grpolab")

BEFORE_RESUME = "metrics.before_resume.csv"  # the rows before the checkpoint while a resumed job runs
STATES = ("finished", "interrupted", "failed", "running or killed", "not started")


def last_checkpoint(out: Path) -> Path:
    """``<out>/checkpoints/last.ckpt``: where ``conf/callbacks/default.yaml`` and the signal handler save it."""
    return out / "checkpoints" / "last.ckpt"


def job_state(out: Path, max_steps: int | None = None) -> str:
    """One of :data:`STATES` for a job folder (:func:`state_of` its :func:`~grpolab.app.run_files.run_status`);
    ``max_steps`` overrides the ``trainer.max_steps`` of its ``.hydra/config.yaml`` (neither: the summary's word)."""
    config = read_config(out)
    if max_steps is not None:
        config = {**config, "trainer": {**(config.get("trainer") or {}), "max_steps": max_steps}}
    return state_of(out, run_status(out, config))


def state_of(out: Path, status: RunStatus) -> str:
    """One of :data:`STATES`: ``finished`` (finished with every number it owes, :mod:`grpolab.app.run_files`),
    ``interrupted`` (a summary marked so, or ``last.ckpt`` without a finished summary: a rerun resumes it),
    ``failed`` (``error.txt``, written by a multirun job that raised, or a summary of a failed run, without a
    checkpoint), ``running or killed`` (started: a ``metrics.csv``, ``.hydra/`` or a summary that is not finished,
    nothing else) or ``not started``."""
    summary = status.summary
    if status.finished:
        return "finished"
    failed = (out / "error.txt").exists() or bool(summary and summary.get("failed"))
    if failed and not last_checkpoint(out).exists():
        return "failed"
    if (summary and summary.get("interrupted")) or last_checkpoint(out).exists():
        return "interrupted"
    if summary is not None or status.warning or (out / "metrics.csv").exists() or (out / ".hydra").is_dir():
        return "running or killed"
    return "not started"


def in_multirun() -> bool:
    """True inside a job of a Hydra multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def claim_job_folder(cfg: DictConfig) -> contextlib.AbstractContextManager:
    """In a multirun job: :func:`grpolab.app.run_identity.claim` of its folder (held while the job runs: a second
    process given the same job, or a job whose folder was trained with other settings, is refused in one line);
    a single run, and every process of a multi-process job but the first (``RANK``/``SLURM_PROCID`` > 0: the tasks
    of one SLURM job share its folder and rank 0's claim): nothing."""
    first = all(os.environ.get(var, "0") == "0" for var in ("RANK", "SLURM_PROCID"))
    if not in_multirun() or not first:
        return contextlib.nullcontext()
    from grpolab.app.run_identity import claim

    return claim(cfg)


def resume_or_skip(cfg: DictConfig) -> dict | None:
    """At the start of a multirun job: the saved summary when the job finished already (skip it), else None, with
    ``cfg.ckpt_path`` set to ``checkpoints/last.ckpt`` when the job was interrupted (resume it). Does nothing
    outside a multirun or when ``ckpt_path`` is set.

    Args:
        cfg: the job's composed config (``paths.output_dir``, ``trainer.max_steps``, ``ckpt_path``); changed in
            place for a resume.

    Returns:
        The finished job's ``summary.json`` (a dict), or None when the job is to run.
    """
    if not in_multirun() or cfg.get("ckpt_path"):
        return None
    out = Path(cfg.paths.output_dir)
    status = run_status(out, cfg)
    if status.warning:
        log.warning("sweep job %s: %s", out.name, status.warning)
    if status.finished:
        log.info("sweep job %s finished already (step %s, summary.json): skipped", out.name, status.summary.get("steps"))
        return status.summary
    if (out / "error.txt").exists():  # the last try failed: keep its traceback beside, not as this try's
        (out / "error.txt").replace(out / "error.before_rerun.txt")
    ckpt = last_checkpoint(out)
    if not ckpt.exists():
        return None
    step = checkpoint_step(ckpt)
    max_steps = OmegaConf.select(cfg, "trainer.max_steps")
    if isinstance(max_steps, int) and 0 <= max_steps <= step:  # stopped after its last step, before its outputs
        log.info("sweep job %s trained all %s steps but stopped before its summary: finishing from %s (final "
                 "validation, eval, summary.json, policy/)", out.name, step, ckpt)
        with open_dict(cfg):
            cfg.finish_from_checkpoint = True  # preflight lets a resume at max_steps through; it trains nothing
    else:
        log.info("sweep job %s was interrupted at step %s: resuming from %s", out.name, step, ckpt)
    cfg.ckpt_path = str(ckpt)
    set_aside_metrics(out, step)
    return None


def checkpoint_step(ckpt: Path) -> int:
    """``global_step`` of a Lightning checkpoint (memory-mapped: the weights are not read)."""
    from grpolab.checkpoint.reading import load_checkpoint

    return int(load_checkpoint(str(ckpt)).get("global_step", 0))


def set_aside_metrics(out: Path, step: int) -> None:
    """Move the rows of ``metrics.csv`` logged before checkpoint step ``step`` to :data:`BEFORE_RESUME` (rows of
    steps after it, written after a periodic checkpoint and before a kill, are dropped: the resumed run logs them
    again). A validation row at ``step`` itself is kept (the checkpoint was saved after it; it is not redone).

    Rows set aside by an earlier resume that was killed before it could put them back (``kill -9``, a node lost)
    are put back first (:func:`stitch_metrics`), so any number of resumes and kills keeps every row."""
    stitch_metrics(out)  # a resume killed before its end: its set-aside rows go back in front of its own
    metrics = out / "metrics.csv"
    if not metrics.exists():
        return
    before = out / BEFORE_RESUME
    with metrics.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = list(reader.fieldnames or []), list(reader)
    keep = [r for r in rows if _row_step(r) < step or (_row_step(r) == step and _is_validation(r))]
    _write_rows(before, fields, keep)
    metrics.unlink()


def stitch_metrics(out: Path) -> None:
    """Put the rows set aside by :func:`set_aside_metrics` back in front of the resumed run's ``metrics.csv`` (the
    union of both headers, in order) and remove :data:`BEFORE_RESUME`. Does nothing when there is none."""
    before, metrics = out / BEFORE_RESUME, out / "metrics.csv"
    if not before.exists():
        return
    tables = []
    for path in (before, metrics):
        if path.exists():
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                tables.append((list(reader.fieldnames or []), list(reader)))
    fields = list(dict.fromkeys(f for names, _ in tables for f in names))
    _write_rows(metrics, fields, [r for _, rows in tables for r in rows])
    before.unlink()


def _row_step(row: dict) -> int:
    try:
        return int(float(row.get("step") or 0))
    except ValueError:
        return 0


def _is_validation(row: dict) -> bool:
    return any(k.startswith("val/") and v not in ("", None) for k, v in row.items())


def _write_rows(path: Path, fields: list[str], rows: list[dict]) -> None:
    write_csv(path, fields, rows)
