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
    is a child of the server (a :class:`forkrun.ForkedPopen`), unless GRPOLAB_TEST_FORK=0."""
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
