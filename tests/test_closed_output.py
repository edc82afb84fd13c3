"""A stop that survives a closed output: ``python src/train.py ... | tee log`` with Ctrl-C (SIGINT to the process
group, which kills ``tee`` too) and ``| head -n 5`` (the reader leaves after five lines). Real processes and pipes;
the progress bar is on, as a user sees it. The printed resume line, run as printed, continues to the run's own
``trainer.max_steps``."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkrun
import pytest
import torch
from test_interrupt import ENV, REPO_ROOT, _cmd

MAX_STEPS = 40  # not the config's 1000 (the resume line must carry it); the stop comes after about 3 steps


def _default_sigint() -> None:
    """A terminal's shell starts a foreground job with SIGINT at its default action; pytest started in the
    background by a script (``cmd &``, nohup) passes SIGINT ignored to every child, and an ignoring ``tee`` would
    outlive the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _piped(out: Path, reader: list[str], *overrides: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    """train.py (stdout and stderr) piped into ``reader``, both in one new process group (a shell job), as a shell runs
    ``python src/train.py ... 2>&1 | tee log`` in a terminal."""
    train = subprocess.Popen(_cmd(out, "trainer.enable_progress_bar=true", *overrides), cwd=REPO_ROOT, env=ENV,
                             process_group=0, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=_default_sigint)
    pipe = subprocess.Popen(reader, stdin=train.stdout, stdout=subprocess.DEVNULL, process_group=train.pid,
                            preexec_fn=_default_sigint)
    train.stdout.close()  # the reader holds the only read end: when it dies, writes fail with EPIPE
    return train, pipe


@pytest.mark.slow
def test_ctrl_c_through_tee_saves_and_the_printed_resume_line_continues_the_run(tmp_path):
    out = tmp_path / "teed"
    train, tee = _piped(out, ["tee", str(tmp_path / "log")], f"trainer.max_steps={MAX_STEPS}")
    metrics, deadline = out / "metrics.csv", time.monotonic() + 180
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > 3):
            assert train.poll() is None and time.monotonic() < deadline, (out / "train.log").read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(train.pid, signal.SIGINT)  # a terminal's Ctrl-C: train.py and tee
        rc = train.wait(timeout=120)
    finally:
        for p in (train, tee):
            if p.poll() is None:
                p.kill()
    assert tee.wait(timeout=10) == -signal.SIGINT  # the reader is gone: every later console write hits EPIPE
    log = (out / "train.log").read_text()
    assert rc == 130, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGINT"
    assert 0 < summary["steps"] < MAX_STEPS
    ckpt = out / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == summary["steps"]
    assert (out / "policy" / "model.safetensors").exists()

    # the resume line as printed (train.log has it: the console was gone), with this interpreter and a test folder
    line = re.search(r"to continue this run: (.*)", log).group(1)
    argv = shlex.split(line)
    assert argv[0] == "python" and f"trainer.max_steps={MAX_STEPS}" in argv and f"ckpt_path={ckpt}" in argv
    resumed = tmp_path / "resumed"
    res = forkrun.run([sys.executable, *argv[1:], f"hydra.run.dir={resumed}"], cwd=REPO_ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["steps"] == MAX_STEPS and summary["interrupted"] is False


@pytest.mark.slow
def test_a_reader_that_leaves_does_not_stop_the_run(tmp_path):
    """``| head -n 5``: the run goes on without a console and finishes; train.log keeps every line."""
    out = tmp_path / "headed"
    train, head = _piped(out, ["head", "-n", "5"], "trainer.max_steps=4")
    try:
        rc = train.wait(timeout=240)
    finally:
        for p in (train, head):
            if p.poll() is None:
                p.kill()
    assert head.wait(timeout=10) == 0
    assert rc == 0, (out / "train.log").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["interrupted"] is False
    assert "summary:" in (out / "train.log").read_text()
