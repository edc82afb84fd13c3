"""Train a policy with on-policy or off-policy GRPO.

    python src/train.py                                   # tiny model, arithmetic task, on-policy, CPU
    python src/train.py algo=grpo_offpolicy               # sampler refreshed every k=10 steps
    python src/train.py -m algo=grpo_onpolicy,grpo_offpolicy seed=0,1
    python src/train.py model=qwen7b trainer=ddp_gpu +plan_only=true   # the memory plan only, nothing loaded

Instantiation happens in a fixed order and every ``_target_`` is logged. Settings are validated before any
model is built. Outputs land in the Hydra run folder: metrics.csv, summary.json, checkpoints/, policy/.
Ctrl-C or SIGTERM during training saves checkpoints/last.ckpt at the next step boundary, summary.json
("interrupted": true) and policy/, logs the command that continues the run, then exits 130 (SIGINT) or 143
(SIGTERM); a second signal aborts at once. During the start validation: the same, at step 0, without a checkpoint;
after the last step (end-of-run validation, final eval): a finished run, exit 0 (docs/guide/training.md). A closed
stdout/stderr (| tee killed by the same Ctrl-C, | head) cannot stop the save.

A config error (a wrong value or type, a missing file, conflicting settings, a misspelt key) prints one line,
``train.py: error: <key>: <what to change>``, and exits with status 2; ``GRPOLAB_TRACEBACK=1`` shows the
traceback (see docs/guide/training.md, "Errors").
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # allow `python src/train.py` without install

from grpolab.app.cli import (  # noqa: E402
    check_overrides,
    discard_empty_run_folder,
    report_user_errors,
    skip_the_exit_collection,
)
from grpolab.app.console import guard_console  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from grpolab.app.sweep_jobs import JobInterrupted, stopped_sweep_code

    if (code := stopped_sweep_code()) is not None:  # a joblib sweep stopped by a signal: a queued job does not start
        raise JobInterrupted(code)
    with report_user_errors("train.py"):
        from grpolab.app.malloc import apply_config

        # before torch allocates (every DDP rank re-runs this)
        apply_config(cfg)
        # torch after the override check (a misspelt key is refused in a second), Lightning after every other check
        from grpolab.app.plan_from_config import print_plan, wants_plan_only
        from grpolab.app.sweep_jobs import task_wrapper

        if wants_plan_only(cfg):  # +plan_only=true: print the memory plan and exit 0, loading nothing
            from grpolab.app.preflight import import_plugins

            import_plugins(cfg.get("imports") or [])  # a loss variant the plan's algo.* names may live there
            print_plan(cfg)
            discard_empty_run_folder()  # the plan is on stdout: no run folder with an empty train.log
            return None
        summary = task_wrapper(_train)(cfg)
    if summary is not None and summary.get("failed"):  # a sampler failure: outputs saved, one line, exit 1
        _report_failure(cfg, summary["failure"])
    if summary is not None and (summary.get("interrupted") or summary.get("signal")):  # Ctrl-C / SIGTERM at any
        # phase, after the last step too (so a sequential sweep stops too): 130 / 143
        from grpolab.app.sweep_jobs import in_joblib_sweep

        code = 128 + signal.Signals[summary["signal"]]
        if in_joblib_sweep():  # the launcher exits with it once every job has saved
            from hydra.core.hydra_config import HydraConfig

            from grpolab.sweep_signals import mark_stopped

            # no later job of the sweep starts (with n_jobs=1 joblib runs the jobs in the launcher's own process,
            # where this job's handler took the signal and the launcher never saw it)
            mark_stopped(HydraConfig.get().sweep.dir, code - 128)
            raise JobInterrupted(code)
        sys.exit(code)
    from grpolab.app.sweep_jobs import objective

    return objective(summary)  # what a sweeper scores (hydra/sweeper=optuna): None fails the trial


def _report_failure(cfg: DictConfig, failure: dict) -> None:
    """One line on stderr: the failure, what was saved and the command that resumes; exit 1. In a multirun the job
    is logged as failed and the sweep goes on (a rerun into the same sweep folder resumes it from last.ckpt)."""
    from hydra.core.hydra_config import HydraConfig

    from grpolab.app.cli import in_multirun, resume_command

    ckpt = failure.get("ckpt_path")
    if in_multirun():
        logging.getLogger("grpolab").error(
            "job failed: the sampler failed after step %s: %s; the sweep continues; rerun the sweep with "
            "hydra.sweep.dir=%s to resume it from %s", failure["step"], failure["reason"][:300],
            HydraConfig.get().sweep.dir, ckpt or "the last periodic checkpoint")
        from grpolab.app.sweep_jobs import record_not_done

        record_not_done(Path(cfg.paths.output_dir), f"failed: the sampler failed after step {failure['step']}")
        return
    command = resume_command(ckpt, "src/train.py")  # shell-quoted: pasted into a shell as is
    resume = (f"; saved {ckpt}; resume with: {command}" if ckpt
              else "; no checkpoint saved at the failure: resume from the last periodic one in checkpoints/")
    print(f"train.py: error: the sampler failed after step {failure['step']}: {failure['reason'][:300]}{resume} "
          f"(summary.json has the traceback)", file=sys.stderr, flush=True)
    sys.exit(1)


def _train(cfg: DictConfig) -> dict:
    from grpolab.app.preflight import preflight
    from grpolab.app.run_folder import RunFolder
    from grpolab.app.slurm import resume_after_requeue
    from grpolab.app.sweep_resume import claim_job_folder, resume_or_skip

    with claim_job_folder(cfg):  # a multirun job's folder: its lock, and the settings that trained what is in it
        done = resume_or_skip(cfg)  # a rerun multirun: a finished job is skipped, an interrupted one resumes
        if done is not None:
            return {**done, "signal": None}  # a stop recorded in its summary was an earlier process's
        resume_after_requeue(cfg)  # a requeued SLURM job resumes from its run folder's last.ckpt (no-op if set above)
        checked = preflight(cfg)  # a config error stops here, before Lightning and the models are imported
        from grpolab.app.run import run_training
        from grpolab.app.sweep_jobs import check_cores

        check_cores(cfg)  # hydra/launcher=joblib: jobs at once x torch threads <= cores, or one line says what to set

        try:
            return run_training(cfg, checked)
        finally:
            RunFolder.of(cfg).stitch_metrics()  # a resumed job's metrics.csv: the rows before, then its own


if __name__ == "__main__":
    skip_the_exit_collection()  # about 1 s of CPU less at exit (grpolab/app/cli.py)
    guard_console()  # a closed stdout/stderr (| tee killed by Ctrl-C, | head) cannot stop the run
    check_overrides(CONFIG_DIR, "train", "train.py")  # a misspelt key: one line naming the closest keys
    main()
    from grpolab.app.sweep_jobs import exit_if_not_done

    exit_if_not_done()  # a sequential multirun whose job failed or was refused: exit 1, naming them
