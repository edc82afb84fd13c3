"""The tests' fork server (tests/forkrun.py) answers as a real ``python src/train.py`` process does."""

from __future__ import annotations

import os
import subprocess
import sys

import forkrun
from conftest import REPO_ROOT

# this file is about the forked runs: they fork here even when GRPOLAB_TEST_FORK=0 runs every other test's for real
ENV = {**{k: v for k, v in os.environ.items() if k != "GRPOLAB_TEST_FORK"}, "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def test_a_forked_run_answers_as_a_real_process(tmp_path):
    """A user error of each entry point: the same exit status and the same last line, forked and real; the forked one
    is a child of the server (a :class:`forkrun.ForkedPopen`); with GRPOLAB_TEST_FORK=0, a real process."""
    for script, args in (("src/train.py", ["algo.epsilonn=0.3"]), ("src/eval.py", ["data=jsonl"])):
        cmd = [sys.executable, script, *args, f"hydra.run.dir={tmp_path / script[4:9]}"]
        forked = forkrun.run(cmd, cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        real = subprocess.run(cmd, cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert (forked.returncode, forked.stderr.splitlines()[-1:]) == (real.returncode, real.stderr.splitlines()[-1:])
        assert forked.returncode == 2 and f"{script[4:]}: error:" in forked.stderr
    with forkrun.Popen(cmd, cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, start_new_session=True) as proc:
        assert isinstance(proc, forkrun.ForkedPopen)
        try:  # its own process group, as Popen's (unless it has already ended and been reaped)
            assert os.getpgid(proc.pid) == proc.pid
        except ProcessLookupError:
            assert proc.poll() is not None
        assert "eval.py: error:" in proc.communicate(timeout=300)[0] and proc.returncode == 2
    real_popen = forkrun.Popen(cmd, cwd=REPO_ROOT, env={**ENV, "GRPOLAB_TEST_FORK": "0"}, stdout=subprocess.DEVNULL)
    assert isinstance(real_popen, subprocess.Popen) and real_popen.wait(timeout=300) == 2


def test_communicate_bounds_the_reading_by_its_timeout_and_can_be_called_again(tmp_path):
    """:meth:`forkrun.ForkedPopen.communicate` as :meth:`subprocess.Popen.communicate`: a run still writing its output
    raises TimeoutExpired once ``timeout`` has passed (it used to read until the output ended, so a test's bound did
    not hold and a run that never ended hung the test), and a second call after the kill returns the output."""
    import signal
    import time

    import pytest
    from conftest import FAST_OVERRIDES

    cmd = [sys.executable, "src/train.py", *FAST_OVERRIDES, "trainer.max_steps=100000", f"hydra.run.dir={tmp_path}"]
    proc = forkrun.Popen(cmd, cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    assert isinstance(proc, forkrun.ForkedPopen)
    try:
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=1)
        assert time.monotonic() - start < 30 and proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and isinstance(out, str) and err is None

def test_a_shells_python_forks_the_entry_points_and_passes_the_rest_to_the_interpreter(tmp_path):
    """forkrun_shell: in a real shell, ``python src/train.py`` runs forked (the client stays the process the shell
    started, its command line ``forkrun.py --client ...``), takes the shell's outputs, answers a user error with the
    real exit status and last line, and ends as an interrupted run when the shell's process gets SIGINT (forwarded);
    ``python -c`` runs in the real interpreter."""
    import contextlib
    import json
    import signal
    import time

    from conftest import FAST_OVERRIDES
    from forkrun_shell import shell_env

    env = shell_env(ENV, tmp_path / "bin")
    bad = ["src/train.py", "algo.epsilonn=0.3", f"hydra.run.dir={tmp_path / 'bad'}"]
    shell = subprocess.run(["bash", "-c", 'python "$@"; echo "status=$?"; python -c "print(\'-c ran\')"',
                            "bash", *bad], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    real = subprocess.run([sys.executable, *bad], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert "status=2" in shell.stdout and "-c ran" in shell.stdout
    assert shell.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    run = tmp_path / "run"
    script = f'python src/train.py {" ".join(FAST_OVERRIDES)} trainer.max_steps=100000 hydra.run.dir={run} &\n' \
             'echo "$!"; wait "$!"; echo "status=$?"'
    proc = subprocess.Popen(["bash", "-c", script], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(proc.stdout.readline())
        deadline = time.monotonic() + 240
        while not ((run / "metrics.csv").exists() and len((run / "metrics.csv").read_text().splitlines()) > 2):
            assert proc.poll() is None and time.monotonic() < deadline, "no training step"
            time.sleep(0.1)
        # the run is training: the client has forked it rather than exec a real interpreter under the same pid
        assert "--client" in open(f"/proc/{pid}/cmdline").read().split("\0")
        os.kill(pid, signal.SIGINT)
        out = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:  # a failure above: the run of 100000 steps must not outlive the test
            for _ in range(2 if pid else 0):  # the second signal aborts at once
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                time.sleep(1)
            proc.kill()
            proc.wait()
    assert "status=130" in out and json.loads((run / "summary.json").read_text())["interrupted"] is True
    assert (run / "checkpoints" / "last.ckpt").exists()
