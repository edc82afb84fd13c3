"""grpolab/sweep_signals.py: a joblib worker outside a job records a signal instead of dying of it, and a stopped
sweep's mark tells a queued job its exit status. (Through the real launcher: tests/test_sweep_resume.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import REPO_ROOT

from grpolab.sweep_signals import STOP_FILE, clear_stopped, mark_stopped, stopped_code

_WORKER = """
import os, signal
from grpolab.sweep_signals import pending_signal, record_between_jobs
record_between_jobs()
assert pending_signal() is None
os.kill(os.getpid(), signal.SIGINT)   # an idle worker's Ctrl-C: no KeyboardInterrupt
os.kill(os.getpid(), signal.SIGTERM)  # a later one does not replace the first
print("alive", pending_signal())
"""


def test_a_worker_between_jobs_records_the_first_signal_and_lives():
    res = subprocess.run([sys.executable, "-c", _WORKER], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["alive", str(int(signal.SIGINT))]


def test_the_stop_mark_gives_the_signals_exit_status_until_cleared(tmp_path):
    sweep = tmp_path / "not_yet" / "sweep"  # a signal before Hydra made the sweep folder
    assert stopped_code(sweep) is None
    mark_stopped(sweep, signal.SIGTERM)
    assert (sweep / STOP_FILE).read_text().strip() == "SIGTERM" and stopped_code(sweep) == 143
    mark_stopped(sweep, signal.SIGINT)
    assert stopped_code(sweep) == 130
    clear_stopped(sweep)
    clear_stopped(sweep)  # nothing to remove: no error
    assert stopped_code(sweep) is None
