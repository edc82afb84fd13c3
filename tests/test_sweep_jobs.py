"""hydra/launcher=joblib (every core): the launcher config composes, and a job warns in one line when jobs at once x
torch threads exceed the cores (grpolab/app/sweep_jobs.py)."""

from __future__ import annotations

import os

from conftest import compose_train_cfg

from grpolab.app.sweep_jobs import check_cores, cores_warning, joblib_jobs


def test_jobs_at_once_follow_joblibs_rule():
    assert joblib_jobs(-1, 8) == 8 and joblib_jobs(-2, 8) == 7 and joblib_jobs(3, 8) == 3 and joblib_jobs(-20, 8) == 1
    assert cores_warning(2, 1, 2) is None
    msg = cores_warning(4, 2, 4)
    assert msg.startswith("4 jobs at once (hydra.launcher.n_jobs) x 2 torch threads (torch_threads) > 4 cores")
    assert "hydra.launcher.n_jobs=2" in msg and "torch_threads=1" in msg and "\n" not in msg


def test_a_joblib_job_checks_its_threads_against_the_cores(tmp_path):
    cores = os.cpu_count() or 1
    cfg = compose_train_cfg(tmp_path, ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={cores}"])
    assert cfg.hydra.launcher._target_ == "hydra_plugins.grpolab_joblib.launcher.JoblibLauncher" and cfg.hydra.launcher.n_jobs == cores
    assert check_cores(cfg) is None  # the tiny model: one thread per job (torch_threads=auto)
    cfg = compose_train_cfg(tmp_path, ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={cores}", "torch_threads=2"])
    assert "hydra.launcher.n_jobs=" in check_cores(cfg)
    cfg = compose_train_cfg(tmp_path, ["hydra/launcher=joblib", "torch_threads=2"])  # n_jobs: -1 = every core
    assert check_cores(cfg) is not None
    assert check_cores(compose_train_cfg(tmp_path, ["torch_threads=2"])) is None  # the basic launcher: one at a time
