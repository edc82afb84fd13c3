"""SLURM preemption and requeue: a job signalled before its time limit or on preemption saves ``last.ckpt`` at the
step boundary, requeues itself, and the requeued job resumes from that checkpoint.

SLURM warns a job with a signal: ``sbatch --signal=USR1@<s>`` (``<s>`` seconds before the time limit; Hydra's
submitit launcher asks for USR2, ``SUBMITIT_PREEMPT_SIGNAL``), or ``scancel --signal=USR1 <job>`` by hand.
Inside a SLURM job (``SLURM_JOB_ID`` set) :class:`~grpolab.callbacks.interrupt.StopOnSignal` also takes USR1 and
USR2 (:func:`requeue_signals`): training stops at the next step boundary with ``checkpoints/last.ckpt`` and the run
writes ``summary.json`` (``"interrupted": true``) and ``policy/`` as for Ctrl-C; then rank 0 runs
``scontrol requeue <job>`` (:func:`requeue`). Preemption with ``PreemptMode=REQUEUE`` and ``scontrol requeue``
send SIGTERM instead, which stops the same way; SLURM requeues the job itself then.

The requeued job runs the same command (``SLURM_RESTART_COUNT`` > 0) and must write into the same run folder
(``hydra.run.dir=.../$SLURM_JOB_ID``; a Hydra multirun job's folder is fixed when the sweep is submitted);
:func:`resume_after_requeue` points ``ckpt_path`` at that folder's ``last.ckpt``, so it resumes exactly.

A job that fails (a config error, a crash, a NaN) exits non-zero without a signal and is not requeued: SLURM
requeues only on preemption, node failure or an explicit ``scontrol requeue``.

This module is the SLURM glue of the training run, not maths: no Lightning imports.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpolab.app.run_folder import RunFolder

log = logging.getLogger(__name__)

REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def in_slurm_job() -> bool:
    """True inside a SLURM allocation (``SLURM_JOB_ID`` set): a batch job, an ``srun`` step or ``salloc``."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def requeue_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop and requeue a run: SIGUSR1 and SIGUSR2 inside a SLURM job, none elsewhere."""
    return REQUEUE_SIGNALS if in_slurm_job() else ()


def job_id() -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for an array task (Hydra's submitit launcher
    submits arrays), else ``SLURM_JOB_ID``; None outside SLURM."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def restart_count() -> int:
    """How many times SLURM has requeued this job (``SLURM_RESTART_COUNT``; 0 for a first start or outside)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def requeued_ckpt_path(cfg: DictConfig) -> Path | None:
    """The ``last.ckpt`` a requeued job resumes from: its own run folder's (the ``callbacks.model_checkpoint``
    dirpath, else ``<paths.output_dir>/checkpoints``) when the job was requeued (``SLURM_RESTART_COUNT`` > 0) and the
    file exists; None otherwise (a first start, or requeued before its first checkpoint).

    A job started with ``ckpt_path=`` (a warm resume from another run) and then requeued resumes from its own
    ``last.ckpt`` as well when that one has trained at least as many steps (from the original checkpoint it would
    train the allocation's steps again, and a job longer than one allocation would never end). None when
    ``ckpt_path`` already names that file (a multirun rerun set it)."""
    if restart_count() <= 0:
        return None
    dirpath = OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath", default=None)
    ckpt_dir = Path(dirpath) if dirpath else Path(cfg.paths.output_dir) / "checkpoints"
    path = ckpt_dir / "last.ckpt"
    if not path.is_file():
        return None
    given = cfg.get("ckpt_path")
    if not given:
        return path
    given = Path(str(given)).expanduser()
    steps = RunFolder.checkpoint_step
    if given.is_file() and (given.resolve() == path.resolve() or steps(given) > steps(path)):
        return None
    return path


def resume_after_requeue(cfg: DictConfig) -> DictConfig:
    """In a requeued SLURM job, set ``cfg.ckpt_path`` to the run folder's ``last.ckpt`` (see
    :func:`requeued_ckpt_path`), in place, before the config is checked, and set the first allocations'
    ``metrics.csv`` rows aside so they are put back in front of this allocation's when the run ends (Lightning's CSV
    logger starts its file anew): :meth:`grpolab.app.run_folder.RunFolder.resume_in_place`. Returns ``cfg``."""
    path = requeued_ckpt_path(cfg)
    if path is None and restart_count() > 0 and not cfg.get("ckpt_path"):
        log.warning("SLURM job %s requeued (restart %d), but its run folder %s holds no last.ckpt: it starts over. "
                    "A requeued job resumes only when it writes into the folder of its first start: "
                    "hydra.run.dir=<folder>/${oc.env:SLURM_JOB_ID} (docs/guide/scale-out.md)", job_id(),
                    restart_count(), cfg.paths.output_dir)
    if path is not None:
        before = cfg.get("ckpt_path")
        step = RunFolder.of(cfg).resume_in_place(cfg, path)
        log.warning("SLURM job %s requeued (restart %d): resuming from %s (step %d)%s", job_id(), restart_count(),
                    path, step, f", not from ckpt_path={before} it started from" if before else "")
    return cfg


def max_requeues() -> int | None:
    """``hydra.launcher.max_num_timeout`` of a job started by Hydra's submitit launcher (``hydra/launcher=slurm``):
    how many times the job may go back to the queue; None outside such a job (no limit)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    value = OmegaConf.select(HydraConfig.get(), "launcher.max_num_timeout", default=None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def will_requeue(signum: int | None) -> bool:
    """True when a stop by ``signum`` ends in a requeue (:func:`requeue`'s conditions but the rank): a SLURM
    requeue signal inside a SLURM job that has requeues left (:func:`max_requeues`). The run then writes only
    ``summary.json`` before asking (``policy/`` of a large model would take the signal's grace period; the
    resumed run writes it at its end)."""
    limit = max_requeues()
    return signum in REQUEUE_SIGNALS and in_slurm_job() and (limit is None or restart_count() < limit)


def requeue(signum: int | None) -> bool:
    """After a requeue signal (USR1/USR2) inside SLURM, with the outputs written: ``scontrol requeue`` this job
    from rank 0 (``SLURM_PROCID`` 0). SLURM then ends every task of the job and starts it again from the top.

    SLURM takes the requeue by ending every task of the job at once (SIGCONT, SIGTERM; SIGKILL after
    ``KillWait``), this process and its ``scontrol`` child included, while ``scontrol`` is still returning: the
    kill and the reply race (on the test cluster the kill came within 30 ms of the reply, often before it). So
    SIGTERM is ignored from the call on, here and in ``scontrol`` (which inherits it): ``scontrol``'s answer is
    read and this process ends by itself (exit 128 + ``signum``) with its log written, instead of dying with
    ``scontrol`` mid-call (a requeue that SLURM took then read as a failed ``scontrol``, killed by SIGTERM).
    When the requeue fails, SIGTERM's handler is restored.

    Returns:
        True when rank 0 asked SLURM to requeue (other ranks and other signals: False). A failed ``scontrol``
        (the job is not requeueable, no controller answers) is logged as one warning line and returns False:
        ``last.ckpt`` is saved, the job ends as interrupted.
    """
    if signum not in REQUEUE_SIGNALS or not in_slurm_job() or os.environ.get("SLURM_PROCID", "0") != "0":
        return False
    jid = job_id()
    if not will_requeue(signum):  # hydra.launcher.max_num_timeout reached: submitit's own limit, kept by ours
        log.warning("%s: SLURM job %s was requeued %d times (hydra.launcher.max_num_timeout=%s): not requeued again; "
                    "last.ckpt is saved, resume with ckpt_path", signal.Signals(signum).name, jid, restart_count(),
                    max_requeues())
        return False
    log.warning("%s: SLURM job %s: last.ckpt saved, asking SLURM to requeue it (it resumes from last.ckpt)",
                signal.Signals(signum).name, jid)
    # SLURM's SIGTERM for the requeue must not kill this process or scontrol before scontrol has answered
    main = threading.current_thread() is threading.main_thread()  # signal.signal works in the main thread only
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    try:
        res = subprocess.run(["scontrol", "requeue", str(jid)], capture_output=True, text=True, timeout=60)
        said = (res.stderr or res.stdout).strip().replace("\n", "; ")
        failure = None if res.returncode == 0 else said or f"exit status {res.returncode}"
    except (OSError, subprocess.TimeoutExpired) as ex:
        failure = str(ex)
    if failure is not None:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        log.warning("scontrol requeue %s failed: %s; last.ckpt is saved, resume with ckpt_path", jid, failure)
        return False
    log.info("SLURM job %s requeued; this process ends now (SIGTERM ignored until it does)", jid)
    return True
