"""submitit's SLURM job watcher, with ``squeue`` where ``sacct`` does not answer.

submitit learns that a job ended without a result (cancelled, killed by the OOM killer, a requeue that never ran
again) only from ``sacct``. On a cluster without accounting storage (``sacct`` prints "Slurm accounting storage is
disabled": a small cluster's default, and ``scripts/slurm_local.sh``'s) such a job reads UNKNOWN for ever, and the
sweep command waits for it for ever; submitit's maintainers hold ``sacct`` required (facebookincubator/submitit#1720).
:class:`SqueueFallbackWatcher` asks ``squeue`` when ``sacct`` fails: a job it lists has the state it lists, and a job
it listed before and no longer knows (its end is older than the controller's ``MinJobAge``, 300 s by default) has
ended: :data:`GONE`. submitit then waits 15 s for the job's result file and raises its ``UncompletedJobError`` ("has
not produced any output (state: ...)"), which the launcher turns into one line and exit status 2.

It relies on submitit's watcher internals (``requirements.txt`` pins submitit 1.5).
"""

from __future__ import annotations

import os
import subprocess
import time

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

GONE = "GONE"  # not a SLURM state: the job has left squeue, and had written no result
# squeue's states of a job that has ended (slurm.schedmd.com/squeue.html, JOB STATE CODES), passed on as they are;
# submitit counts every state but READY, PENDING, RUNNING, UNKNOWN, REQUEUED, COMPLETING and PREEMPTED as ended. So a
# job cancelled by preemption (PREEMPTED) ends the sweep only once it is GONE, MinJobAge later, as with sacct.
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT"})
# every other state is passed on as PENDING (these) or RUNNING, states submitit counts as unfinished
UNSTARTED = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "CONFIGURING"})
CONFIRM_S = 5.0  # an end is taken once a read at least this much later still finds it (a job requeueing itself reads
#                  FAILED for a moment before it is PENDING again)
FALLBACK_DELAY_S = 15  # at most this long between two reads while sacct does not answer (submitit's delay: 600 s)
# squeue's filters a user may set (man squeue, ENVIRONMENT VARIABLES): they would hide a sweep's jobs
SQUEUE_FILTERS = ("SQUEUE_ACCOUNT", "SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SQUEUE_LICENSES", "SQUEUE_NAMES",
                  "SQUEUE_PARTITION", "SQUEUE_QOS", "SQUEUE_STATES", "SQUEUE_USERS")


def squeue_states(job_ids: set[str], timeout: float = 60) -> dict[str, str] | None:
    """The state of each array task or job that ``squeue`` lists among ``job_ids`` (base ids: ``"123"`` gives
    ``"123_0"``, ``"123_1"``, ... for an array), as submitit names its jobs; None when ``squeue`` did not answer
    (no controller, not installed, ``timeout`` seconds passed). A job it no longer knows is absent. The user's
    filters (:data:`SQUEUE_FILTERS`: ``SQUEUE_USERS``, ``SQUEUE_NAMES``, ...) are not applied: they would hide the
    jobs."""
    cmd = ["squeue", "-h", "-r", "--states=all", "-o", "%i|%T", f"--jobs={','.join(sorted(job_ids))}"]
    env = {k: v for k, v in os.environ.items() if k not in SQUEUE_FILTERS}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
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
    2 s, 4 s, 8 s, ... after the last submission, then every ``delay_s``) with ``squeue`` where ``sacct`` fails, read
    at most :data:`FALLBACK_DELAY_S` apart while it fails. A job ``squeue`` lists takes the state it lists; an end
    (an ended state, or :data:`GONE` for a job it listed before and lists no more) is taken once a later read, at
    least :data:`CONFIRM_S` after the first, still finds it, and the job keeps its previous state meanwhile. Where
    both commands fail, the states stay as they were (UNKNOWN: unfinished)."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s=delay_s)
        self._base_delay_s = delay_s
        self._seen: set[str] = set()  # jobs squeue has listed: only these can be GONE (a SQUEUE_* filter, say)
        self._ends: dict[str, float] = {}  # job -> when squeue first read it ended (not yet confirmed)

    def update(self) -> None:  # submitit's own, with the fallback: the same bookkeeping of calls and finished jobs
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            self._output = subprocess.check_output(command, stderr=subprocess.PIPE, timeout=60)
            self._info_dict.update(self.read_info(self._output))
            self._delay_s = self._base_delay_s
        except (OSError, subprocess.SubprocessError):
            self._delay_s = min(self._base_delay_s, FALLBACK_DELAY_S)
            self._info_dict.update(self._from_squeue(self._registered - self._finished))
        self._last_status_check = time.time()
        for job in self._registered - self._finished:
            if self.is_done(job, mode="cache"):
                self._finished.add(job)

    def _from_squeue(self, waiting: set[str]) -> dict[str, dict[str, str]]:
        """The info of the ``waiting`` jobs ``squeue`` answers for, an end only once confirmed (see the class)."""
        states = squeue_states({job.split("_")[0] for job in waiting})
        if states is None:
            return {}
        self._seen |= waiting & states.keys()
        now, info = time.monotonic(), {}
        for job in waiting & (states.keys() | self._seen):
            state = states.get(job, GONE)
            if state == GONE or (state in ENDED and state != "PREEMPTED"):  # PREEMPTED: unfinished to submitit
                if now - self._ends.setdefault(job, now) < CONFIRM_S:
                    continue  # the first read of its end (a requeue reads FAILED for a moment): not yet
            else:
                self._ends.pop(job, None)
            info[job] = {"JobID": job, "State": state}
        return info


def install() -> None:
    """Make :class:`SqueueFallbackWatcher` the watcher of every submitit SLURM job of this process (submitit keeps
    one, on the job class), keeping its refresh delay. Idempotent."""
    if not isinstance(SlurmJob.watcher, SqueueFallbackWatcher):
        SlurmJob.watcher = SqueueFallbackWatcher(delay_s=SlurmJob.watcher._delay_s)  # noqa: SLF001
