"""grpolab's Hydra launcher plugin (Hydra takes launchers only from the ``hydra_plugins`` namespace package).

``hydra/launcher=slurm``: Hydra's submitit SLURM launcher (``hydra-submitit-launcher``), with SLURM's refusals as
one line instead of a traceback.

``sbatch`` refusing the sweep (a partition that does not exist, a controller that does not answer, ``sbatch`` not
installed) and a job that ends without a result (a config error, a crash, ``scancel``: see its log under
``hydra.launcher.submitit_folder``) print ``train.py: error: hydra/launcher=slurm: <what SLURM said>`` and exit 2.
A cluster without accounting storage (no ``sacct``) is watched with ``squeue`` (:mod:`.watcher`): a job that ended
there without a result ends the sweep too, instead of being waited for for ever.
Nothing is lost: the sweep folder keeps what the jobs wrote, and jobs already submitted run on in SLURM (``squeue``;
``scancel <job>`` stops them). ``GRPOLAB_TRACEBACK=1`` shows the traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher

from grpolab.app.cli import fail, wants_traceback


def slurm_error_line(ex: BaseException) -> str:
    """The message of a submitit/sbatch error ``ex`` reduced to what SLURM said: its ``sbatch: error:`` lines, else
    its first non-empty line, with the second where it gives the job's state (submitit appends a job's whole log to
    an uncompleted job's error, after "Job 12_0 (task: 0) with path ..." and "has not produced any output (state:
    CANCELLED)")."""
    lines = [ln.strip() for ln in str(ex).splitlines() if ln.strip()]
    sbatch = [ln for ln in lines if ln.startswith("sbatch: error:")]
    if not sbatch and len(lines) > 1 and lines[1].startswith("has not produced any output"):
        return f"{lines[0]} {lines[1]}"
    return "; ".join(sbatch or lines[:1]) or type(ex).__name__


class SlurmLauncher(_SubmititSlurmLauncher):
    """Hydra's ``submitit_slurm`` launcher whose SLURM errors end the sweep command with one line, status 2."""

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:  # noqa: D102 (Hydra's Launcher.launch)
        from submitit.core.utils import FailedJobError, UncompletedJobError

        from grpolab.app.sweep_jobs import clear_not_done, exit_if_not_done

        from .watcher import install

        install()  # a job that ends without a result is seen without sacct too
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        clear_not_done(sweep_dir)
        try:
            results = super().launch(job_overrides, initial_job_idx)
        except (FailedJobError, UncompletedJobError, OSError) as ex:
            if wants_traceback():
                raise
            fail(Path(sys.argv[0]).name or "train.py", f"hydra/launcher=slurm: {slurm_error_line(ex)}")
        exit_if_not_done(sweep_dir)  # a job that failed or was refused: exit 1 once every job has returned
        return results
