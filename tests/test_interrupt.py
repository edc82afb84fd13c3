"""Runs that survive interruption: real SIGINT (terminal Ctrl-C: the whole process group) and SIGTERM (SLURM: the
process alone) sent to ``python src/train.py``; the saved last.ckpt resumes to the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkrun
import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg
from safetensors.torch import load_file

from grpolab.app.run import build

TOTAL = 24  # optimizer steps of the reference run; the interrupted runs stop well before it
COMMON = [*FAST_OVERRIDES, "val.at_start=false", "trainer.val_check_interval=1000",
          "callbacks.completions.every_n_steps=1000"]
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def _cmd(out: Path, *overrides: str) -> list[str]:
    keys = {o.split("=")[0] for o in overrides}  # an override replaces COMMON's value of its key
    common = [o for o in COMMON if o.split("=")[0] not in keys]
    return [sys.executable, str(REPO_ROOT / "src" / "train.py"), *common, f"hydra.run.dir={out}", *overrides]


def _train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """Run src/train.py to the end in a fresh process (one torch thread, as the interrupted runs)."""
    return forkrun.run(_cmd(out, *overrides), cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=240)


def _interrupt(out: Path, sig: signal.Signals, group: bool, after_rows: int = 3) -> tuple[int, str]:
    """Start a long run in its own session, wait until metrics.csv has ``after_rows`` steps, send ``sig`` to its
    process group (``group``) or to the process alone. Returns the exit status and the output."""
    proc = forkrun.Popen(_cmd(out, "trainer.max_steps=1000"), cwd=REPO_ROOT, env=ENV, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics, deadline = out / "metrics.csv", time.monotonic() + 180
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > after_rows):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no training steps within 180 s"
            time.sleep(0.1)
        (os.killpg if group else os.kill)(proc.pid, sig)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def _policy(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "policy" / "model.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted TOTAL-step run, shared by the tests."""
    out = tmp_path_factory.mktemp("interrupt") / "reference"
    res = _train(out, f"trainer.max_steps={TOTAL}")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["signal"] is None and summary["steps"] == TOTAL
    return out


def _check_interrupted(out: Path, rc: int, output: str, sig: signal.Signals) -> Path:
    """The interrupted run's exit status, summary, checkpoint and policy; returns the checkpoint."""
    assert rc == 128 + sig, output[-3000:]  # 130 for SIGINT, 143 for SIGTERM
    ckpt = out / "checkpoints" / "last.ckpt"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == sig.name
    step = summary["steps"]
    assert 0 < step < TOTAL, step
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == step  # the step reached
    assert (out / "policy" / "model.safetensors").exists()
    return ckpt


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_saves_a_resumable_checkpoint_and_exits_130(reference, tmp_path):
    out = tmp_path / "sigint"
    rc, output = _interrupt(out, signal.SIGINT, group=True)
    assert "SIGINT received: stopping after the current training step" in output
    ckpt = _check_interrupted(out, rc, output, signal.SIGINT)
    # resumed to the reference's length: bit for bit the uninterrupted run's weights. With the progress bar on, as
    # a user sees it: Lightning skips on_train_epoch_start when resuming mid-epoch, and the bar still counts n/TOTAL.
    resumed = tmp_path / "sigint_resumed"
    res = _train(resumed, f"trainer.max_steps={TOTAL}", f"ckpt_path={ckpt}", "trainer.enable_progress_bar=true")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((resumed / "summary.json").read_text())["steps"] == TOTAL
    a, b = _policy(reference), _policy(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    bar = [line for line in res.stdout.replace("\r", "\n").splitlines() if line.startswith("GRPO step")]
    assert bar and f"{TOTAL}/{TOTAL}" in bar[-1], res.stdout[-2000:]
    assert all(f"/{TOTAL} " in line for line in bar[1:]), bar  # bar[0]: drawn by Lightning when it creates the bar


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_a_hangup_saves_a_resumable_checkpoint_and_exits_128_plus_the_signal(reference, tmp_path, sig):
    """SIGTERM (SLURM, kill) and SIGHUP (an ssh session that drops) go through the same stop-at-the-step-boundary
    path as Ctrl-C (whose checkpoint the test above resumes bit for bit); here: the process alone gets it, exits
    128 + the signal (143, 129) and saves the step it reached."""
    out = tmp_path / sig.name
    rc, output = _interrupt(out, sig, group=False)
    assert f"{sig.name} received: stopping after the current training step" in output
    _check_interrupted(out, rc, output, sig)


def test_resume_past_max_steps_says_so_and_how_to_continue(reference, tmp_path):
    ckpt = reference / "checkpoints" / "last.ckpt"
    cfg = compose_train_cfg(tmp_path, [*COMMON, f"trainer.max_steps={TOTAL}", f"ckpt_path={ckpt}"])
    with pytest.raises(ValueError) as err:
        build(cfg)  # before any model is built
    msg = str(err.value)
    assert f"trainer.max_steps={TOTAL} is already reached" in msg and f"(step {TOTAL})" in msg
    assert f"trainer.max_steps=<larger than {TOTAL}>" in msg and "\n" not in msg
