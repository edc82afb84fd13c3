"""Reward worker processes never outlive their training process, and survive the threads that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from slow_funcs import regex_bomb_on_marker

from grpolab.verifiers.process_pool import ProcessPool

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

# The training process stand-in: a pool whose two workers are stuck in a C call that holds the GIL (2**60 regex
# steps), started from a thread; it prints the workers' pids once both are busy, then waits to be killed.
OWNER = textwrap.dedent("""
    import threading, time
    from slow_funcs import regex_bomb_on_marker
    from grpolab.verifiers.process_pool import ProcessPool

    pool = ProcessPool({"slow": regex_bomb_on_marker}, num_workers=2, timeout_s=None)
    threading.Thread(target=pool.run, args=([("slow", (["HANG"],), {})] * 2,), daemon=True).start()
    while len(pool._workers) < 2 or any(w.state != "busy" for w in pool._workers):
        time.sleep(0.05)
    time.sleep(0.3)
    print(" ".join(str(w.proc.pid) for w in pool._workers), flush=True)
    time.sleep(600)
""")


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's zombie waits for a reaper that may not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_workers_stuck_in_a_hung_call_go_when_the_training_process_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=env)
    pids: list[int] = []
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(p) for p in pids)
        os.kill(owner.pid, signal.SIGKILL)  # no finalizer, no atexit: only the workers' own guard can act
        owner.wait()
        deadline = time.monotonic() + 5.0
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(p) for p in pids), "reward workers outlived their killed training process"
    finally:
        owner.kill()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_workers_started_from_a_thread_that_ended_keep_serving():
    # Linux's parent-death signal follows the thread that forked: a pool first used from a short-lived thread
    # (a background rollout job) must not lose its workers when that thread ends
    pool = ProcessPool({"slow": regex_bomb_on_marker}, num_workers=1, timeout_s=30)
    try:
        t = threading.Thread(target=pool.run, args=([("slow", (["ok"],), {})],))
        t.start()
        t.join(60)
        pid = pool._workers[0].proc.pid
        time.sleep(0.5)
        assert pool._workers[0].proc.poll() is None
        assert pool.run([("slow", (["ok"],), {})])[0].value == [1.0]
        assert pool.num_restarts == 0 and pool._workers[0].proc.pid == pid
    finally:
        pool.close()


def test_a_worker_ignores_sigterm_while_its_training_process_lives():
    # SLURM's SIGTERM reaches every process of a job: the trainer finishes its step with these workers' rewards
    pool = ProcessPool({"slow": regex_bomb_on_marker}, num_workers=1, timeout_s=30)
    try:
        pool.run([("slow", (["ok"],), {})])
        os.kill(pool._workers[0].proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert pool.run([("slow", (["ok"],), {})])[0].value == [1.0] and pool.num_restarts == 0
    finally:
        pool.close()
