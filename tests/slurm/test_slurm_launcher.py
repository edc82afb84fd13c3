"""``hydra/launcher=slurm`` on a real one-node SLURM cluster (scripts/slurm_local.sh): a 2-job multirun ends with both
summary.json; bad input (a launcher key or a partition that does not exist, a controller that does not answer) ends
the sweep command with one line, exit 2, and leaves no job or process behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import forkrun
import pytest
from conftest import REPO_ROOT
from slurm_helpers import ENV, require_cluster, train_cmd

pytestmark = pytest.mark.slow  # minutes of SLURM round trips: started first under -n auto

SWEEP = ["hydra/launcher=slurm", "trainer.max_steps=2", "val.at_start=false", "seed=0,1"]


def _sweep(folder: Path, *overrides: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = train_cmd(*SWEEP, f"hydra.sweep.dir={folder}", *overrides)
    cmd.insert(2, "-m")  # python src/train.py -m ...
    return forkrun.run(cmd, cwd=REPO_ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout)


def _error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: ") and "Traceback" not in res.stderr, res.stderr[-3000:]
    return last


def _no_jobs_named(name: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30).stdout
    return name not in out.split()


def test_two_job_multirun_through_the_slurm_launcher_writes_both_summaries(tmp_path):
    require_cluster()
    res = _sweep(tmp_path / "sweep", "hydra.launcher.name=grpolab_t2jobs")
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2, list((tmp_path / "sweep").iterdir())
    got = [json.loads(p.read_text()) for p in summaries]
    assert sorted(s["seed"] for s in got) == [0, 1]
    assert all(s["steps"] == 2 and s["interrupted"] is False for s in got)
    # each job ran inside SLURM: submitit's per-job folder holds its sbatch script and log
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*/*_submission.sh"))) >= 1


def test_a_partition_that_does_not_exist_is_one_line_and_leaves_nothing(tmp_path):
    require_cluster()
    res = _sweep(tmp_path / "sweep", "hydra.launcher.partition=no_such_partition", "hydra.launcher.name=grpolab_tbad",
                 timeout=120)
    line = _error_line(res)
    assert "hydra/launcher=slurm" in line and "partition" in line.lower(), line
    assert not list((tmp_path / "sweep").glob("*/summary.json"))
    assert _no_jobs_named("grpolab_tbad")


def test_a_cluster_that_does_not_answer_is_one_line(tmp_path):
    """sbatch against a controller nobody listens on (a slurm.conf of our own via SLURM_CONF): one line, exit 2."""
    import shutil

    if not shutil.which("sbatch"):
        pytest.skip("sbatch is not installed (apt-get install slurm-wlm)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=2\n"
                    "NodeName=localhost CPUs=1\nPartitionName=debug Nodes=localhost Default=YES\n")
    res = _sweep(tmp_path / "sweep", env={**ENV, "SLURM_CONF": str(conf)}, timeout=120)
    line = _error_line(res)
    assert "hydra/launcher=slurm" in line and "controller" in line, line


def test_a_launcher_key_that_does_not_exist_is_one_line(tmp_path):
    res = _sweep(tmp_path / "sweep", "hydra.launcher.partitionn=debug", timeout=60)
    line = _error_line(res)
    assert "hydra.launcher.partitionn" in line and "hydra.launcher.partition" in line, line
    assert not (tmp_path / "sweep").exists()
