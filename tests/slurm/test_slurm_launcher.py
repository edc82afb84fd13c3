"""``hydra/launcher=slurm`` on a real one-node SLURM cluster (scripts/slurm_local.sh): a 2-job multirun ends with both
summary.json; bad input (a launcher key or a partition that does not exist, a controller that does not answer) ends
the sweep command with one line, exit 2, and leaves no job or process behind; so does a job killed without a result,
on this cluster without accounting storage (``sacct`` does not answer: the watcher asks ``squeue``)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import forkrun
import pytest
from conftest import REPO_ROOT
from slurm_helpers import ENV, job_named, require_cluster, sbatch, train_cmd

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


def test_squeue_gives_the_states_of_a_sweeps_jobs_without_sacct(tmp_path, monkeypatch):
    """:func:`squeue_states`: each array task's state as submitit names it (whatever ``SQUEUE_*`` filters the user
    set), an ended one by its end state, and nothing for an id SLURM does not know. :class:`SqueueFallbackWatcher`
    reads them where sacct fails (as it does here), an end once a read CONFIRM_S later still finds it; a job it has
    never seen listed stays unfinished, one it saw and SLURM no longer knows has ended (GONE)."""
    from hydra_plugins.grpolab_slurm.watcher import CONFIRM_S, GONE, SqueueFallbackWatcher, squeue_states

    def state_after_two_reads(watcher: SqueueFallbackWatcher, job: str) -> tuple[str, str]:
        time.sleep(0.01)  # submitit ignores a forced read less than 1 ms after the last one
        first = watcher.get_state(job, mode="force")
        time.sleep(CONFIRM_S + 0.1)
        return first, watcher.get_state(job, mode="force")

    require_cluster()
    if subprocess.run(["sacct", "-j", "1"], capture_output=True, timeout=30).returncode == 0:
        pytest.skip("this cluster has accounting storage: submitit's sacct answers, the fallback is not used")
    job = sbatch("sleep 60", tmp_path, "--array=0-1", "--begin=now+120")  # held: pending for the whole test
    monkeypatch.setenv("SQUEUE_NAMES", "no_such_job_name")  # a user's filter: squeue alone would list nothing
    try:
        assert squeue_states({job}) == {f"{job}_0": "PENDING", f"{job}_1": "PENDING"}
        watcher = SqueueFallbackWatcher(delay_s=600)
        assert watcher.get_state(f"{job}_1", mode="force") == "PENDING" and not watcher.is_done(f"{job}_1", "cache")
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while (squeue_states({job}) or {}).get(f"{job}_0") != "CANCELLED":
        assert time.monotonic() < deadline, squeue_states({job})
        time.sleep(0.5)
    # the first read of the end leaves the state it had; the second, CONFIRM_S later, takes it
    assert state_after_two_reads(watcher, f"{job}_1") == ("PENDING", "CANCELLED")
    assert watcher.is_done(f"{job}_1", "cache")
    assert squeue_states({"99999999"}) == {} and squeue_states({"99999998", "99999999"}) == {}
    unknown = SqueueFallbackWatcher(delay_s=600)
    assert unknown.get_state("99999999_0", mode="force") == "UNKNOWN" and not unknown.is_done("99999999_0", "cache")
    unknown._seen.add("99999999_0")  # listed once, unknown now: its end is older than MinJobAge (300 s: not waited)
    assert state_after_two_reads(unknown, "99999999_0") == ("UNKNOWN", GONE)
    assert unknown.is_done("99999999_0", "cache")


def test_a_job_killed_without_a_result_ends_the_sweep_with_one_line(tmp_path):
    """A job killed while it runs (SIGKILL to its steps: an OOM kill or a crash alike; here once SLURM runs it, before
    it trains, to spare the CPU) writes no result. The sweep command ends within a minute with one line naming the job
    and its state, status 2; submitit alone reads job states from sacct, which this cluster does not have, and waited
    for such a job for ever."""
    require_cluster()
    name = f"grpolab_tkill_{uuid.uuid4().hex[:12]}"  # no other session's job
    cmd = train_cmd("hydra/launcher=slurm", "trainer.max_steps=100000", "val.at_start=false", "seed=0",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.launcher.name={name}")
    cmd.insert(2, "-m")
    sweep = forkrun.Popen(cmd, cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (job := job_named(name, "RUNNING")):
            assert sweep.poll() is None, sweep.communicate(timeout=60)[0][-3000:]
            assert time.monotonic() < deadline, f"SLURM ran no job named {name} within 180 s"
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=KILL", job], check=True, timeout=30)
        killed = time.monotonic()
        output = sweep.communicate(timeout=120)[0]
    finally:
        if sweep.poll() is None:
            sweep.kill()
        subprocess.run(["scancel", "-n", name], capture_output=True, timeout=30)
    assert sweep.returncode == 2, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"train.py: error: hydra/launcher=slurm: Job {job}") and "has not produced any output" \
        in last and "Traceback" not in output, output[-3000:]
    assert time.monotonic() - killed < 90
