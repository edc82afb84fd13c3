"""submitit's SLURM job watcher, with ``squeue`` where ``sacct`` does not answer.

submitit learns that a job ended without a result (cancelled, killed by the OOM killer, on a node that failed, a
requeue that never ran again) only from ``sacct``. On a cluster without accounting storage (``sacct`` prints "Slurm
accounting storage is disabled": a small cluster's default, and ``scripts/slurm_local.sh``'s) such a job reads
UNKNOWN for ever, and the sweep command waits for it for ever; submitit's maintainers hold ``sacct`` required
(facebookincubator/submitit#1720). :class:`SqueueFallbackWatcher` asks ``squeue`` when ``sacct`` fails: a job it
lists has the state it lists, and a job it no longer knows (its end is older than the controller's ``MinJobAge``,
300 s by default) has ended: :data:`GONE`. submitit then raises its ``UncompletedJobError`` for the job ("has not
produced any output"), which the launcher turns into one line and exit status 2.
"""

from __future__ import annotations

import subprocess
import time

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

GONE = "GONE"  # not a SLURM state: the job has left squeue, and had written no result
# squeue's states of a job that has ended (slurm.schedmd.com/squeue.html, JOB STATE CODES); every other one is
# reported as PENDING or RUNNING, states submitit knows as unfinished (it takes any state it does not list as ended)
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})
UNSTARTED = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "CONFIGURING"})


def squeue_states(job_ids: set[str], timeout: float = 60) -> dict[str, str] | None:
    """The state of each array task or job that ``squeue`` lists among ``job_ids`` (base ids: ``"123"`` gives
    ``"123_0"``, ``"123_1"``, ... for an array), as submitit names its jobs; None when ``squeue`` did not answer
    (no controller, not installed, ``timeout`` seconds passed). A job it no longer knows is absent."""
    cmd = ["squeue", "-h", "-r", "--states=all", "-o", "%i|%T", "-j", ",".join(sorted(job_ids))]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        # one id it no longer knows is an error (several are an empty list): the same answer, no job listed
        return {} if "Invalid job id" in res.stderr else None
    states: dict[str, str] = {}
    for line in res.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = state if state in ENDED else "PENDING" if state in UNSTARTED else "RUNNING"
    return states


class SqueueFallbackWatcher(SlurmInfoWatcher):
    """:class:`submitit.slurm.slurm.SlurmInfoWatcher` (the states of a sweep's jobs, refreshed at submitit's pace:
    2 s, 4 s, 8 s, ... after the last submission, then every ``delay_s``) with ``squeue`` where ``sacct`` fails: a
    job ``squeue`` lists takes the state it lists, a job it no longer knows takes :data:`GONE` (ended). Where both
    fail, the states stay as they were (UNKNOWN: unfinished) until the next refresh."""

    def update(self) -> None:  # submitit's own, with the fallback: the same bookkeeping of calls and finished jobs
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            self._output = subprocess.check_output(command, stderr=subprocess.PIPE, timeout=60)
            self._info_dict.update(self.read_info(self._output))
        except (OSError, subprocess.SubprocessError):
            waiting = self._registered - self._finished
            states = squeue_states({job.split("_")[0] for job in waiting})
            if states is not None:
                for job in waiting:
                    self._info_dict[job] = {"JobID": job, "State": states.get(job, GONE)}
        self._last_status_check = time.time()
        for job in self._registered - self._finished:
            if self.is_done(job, mode="cache"):
                self._finished.add(job)


def install() -> None:
    """Make :class:`SqueueFallbackWatcher` the watcher of every submitit SLURM job of this process (submitit keeps
    one, on the job class), keeping its refresh delay. Idempotent."""
    if not isinstance(SlurmJob.watcher, SqueueFallbackWatcher):
        SlurmJob.watcher = SqueueFallbackWatcher(delay_s=SlurmJob.watcher._delay_s)  # noqa: SLF001
