"""Multiruns that resume: rerunning the same ``-m`` command into the same sweep folder skips the finished jobs and
resumes the interrupted ones.

A multirun job's folder is ``<hydra.sweep.dir>/<num>_<overrides>`` (``conf/hydra/default.yaml``): the same command
with the same ``hydra.sweep.dir=...`` gives every job the folder it had before (``hydra.job.chdir`` is false and
the name holds no time stamp). At the start of each job (:func:`resume_or_skip`, from ``src/train.py``):

- **finished** (``summary.json`` with ``"interrupted": false``, not failed, ``steps`` >= ``trainer.max_steps`` and
  the final eval's score when ``final_eval.enabled``: :meth:`grpolab.app.run_folder.RunFolder.status`): the job
  logs one line and returns the saved summary, so the multirun counts it as a success; nothing in its folder is
  written again except Hydra's own ``.hydra/*.yaml`` (the same composed config), one line in ``train.log``
  and the pid in ``.run.lock`` (:mod:`grpolab.app.run_identity`).
- **interrupted** (no finished summary, ``checkpoints/last.ckpt`` present: Ctrl-C, SIGTERM, a killed process
  after a periodic checkpoint): ``ckpt_path`` is set to that checkpoint, and the run resumes exactly (the same
  path as ``ckpt_path=...`` by hand). ``metrics.csv`` is kept whole: the rows before the checkpoint are set aside
  (``metrics.before_resume.csv``) while Lightning's CSV logger starts its file anew, and put back in front of the
  new rows when the run ends (:meth:`~grpolab.app.run_folder.RunFolder.resume_in_place`).
- anything else (not started, failed before a checkpoint): the job runs from the start.

A run that sets ``ckpt_path=`` itself, and a single run (not ``-m``), are left alone. What a folder's state is, and
how a resume keeps its metrics, is :class:`~grpolab.app.run_folder.RunFolder`'s; this module is the multirun's
trigger of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, open_dict

from grpolab.app.cli import in_multirun
from grpolab.app.run_folder import ERROR, RunFolder

log = logging.getLogger("grpolab")


def job_state(out: Path, max_steps: int | None = None) -> str:
    """The state of a job folder (:meth:`RunFolder.state`)."""
    return RunFolder(out).state(max_steps=max_steps)


def claim_job_folder(cfg: DictConfig) -> contextlib.AbstractContextManager:
    """In a multirun job: :meth:`RunFolder.claim` of its folder (held while the job runs: a second process given the
    same job, or a job whose folder was trained with other settings, is refused in one line); a single run, and
    every process of a multi-process job but the first (``RANK``/``SLURM_PROCID`` > 0: the tasks of one SLURM job
    share its folder and rank 0's claim): nothing."""
    first = all(os.environ.get(var, "0") == "0" for var in ("RANK", "SLURM_PROCID"))
    if not in_multirun() or not first:
        return contextlib.nullcontext()
    return RunFolder.of(cfg).claim(cfg)


def resume_or_skip(cfg: DictConfig) -> dict | None:
    """At the start of a multirun job: the saved summary when the job finished already (skip it), else None, with
    the job resumed in place (:meth:`RunFolder.resume_in_place`) when it was interrupted. Does nothing outside a
    multirun or when ``ckpt_path`` is set.

    Args:
        cfg: the job's composed config (``paths.output_dir``, ``trainer.max_steps``, ``ckpt_path``); changed in
            place for a resume.

    Returns:
        The finished job's ``summary.json`` (a dict), or None when the job is to run.
    """
    if not in_multirun() or cfg.get("ckpt_path"):
        return None
    folder = RunFolder.of(cfg)
    name = folder.path.name
    status = folder.status(cfg)
    if status.warning:
        log.warning("sweep job %s: %s", name, status.warning)
    if status.finished:
        log.info("sweep job %s finished already (step %s, summary.json): skipped", name, status.summary.get("steps"))
        return status.summary
    if (folder.path / ERROR).exists():  # the last try failed: keep its traceback beside, not as this try's
        (folder.path / ERROR).replace(folder.path / "error.before_rerun.txt")
    ckpt = folder.last_checkpoint
    if not ckpt.exists():
        return None
    step = folder.resume_in_place(cfg, ckpt)
    if folder.owes_only_its_outputs(cfg, step):  # stopped after its last step, before its outputs
        log.info("sweep job %s trained all %s steps but stopped before its summary: finishing from %s (final "
                 "validation, eval, summary.json, policy/)", name, step, ckpt)
        with open_dict(cfg):
            cfg.finish_from_checkpoint = True  # preflight lets a resume at max_steps through; it trains nothing
    else:
        log.info("sweep job %s was interrupted at step %s: resuming from %s", name, step, ckpt)
    return None
