"""Signals outside training steps: during the validation at start (nothing trained yet) and during the final
validation (training finished). Real ``python src/train.py`` processes; the held-out set is made large enough
(2000 rows, batches of 8: seconds) that the signal, sent when the phase logs its start, lands inside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import forkrun
import pytest
import torch
from test_interrupt import ENV, REPO_ROOT, _cmd

LONG_VAL = ["data.val_size=2000", "val.batch_size=8"]


def _signal_at(out: Path, marker: str, sig: signal.Signals, group: bool, *overrides: str) -> tuple[int, str]:
    """Start train.py in its own session, read its output until a line holds ``marker``, send ``sig`` (to the
    process group when ``group``, as a terminal's Ctrl-C; else to the process alone, as SLURM's SIGTERM).
    Returns the exit status and the whole output."""
    proc = forkrun.Popen(_cmd(out, *LONG_VAL, *overrides), cwd=REPO_ROOT, env=ENV, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.monotonic() + 180
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                (os.killpg if group else os.kill)(proc.pid, sig)
                break
            assert time.monotonic() < deadline, "the phase did not start within 180 s"
        else:
            pytest.fail("".join(lines)[-3000:])
        lines.append(proc.communicate(timeout=120)[0])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, "".join(lines)


# One delivery per phase (a run each costs a start-up): SLURM's SIGTERM to the process alone at the start, a
# terminal's Ctrl-C to the group at the end; both reach the same handler (tests/test_interrupt.py runs both in training).
@pytest.mark.slow
@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False)])
def test_signal_during_the_start_validation_is_an_interrupted_run_at_step_0(tmp_path, sig, group):
    out = tmp_path / "start"
    rc, output = _signal_at(out, "start validation at step 0", sig, group, "val.at_start=true",
                            "trainer.max_steps=1000")
    assert rc == 128 + sig, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == sig.name, summary
    assert summary["stopped_in"] == "start validation" and summary["steps"] == 0
    assert summary["val_history"] == []  # the cut validation is not reported as a measurement
    assert (out / "policy" / "model.safetensors").exists()
    assert "training stopped" not in output and "start validation stopped" in output


@pytest.mark.slow
@pytest.mark.parametrize("sig,group", [(signal.SIGINT, True)])
def test_signal_during_the_final_validation_leaves_complete_training_that_owes_its_number(tmp_path, sig, group):
    """Training finished (last.ckpt at the last step): not marked interrupted (a resume would train nothing), the
    summary says which signal cut what, the run is not finished (it owes val_accuracy_end), and the process exits
    with the signal's status (issue 39 item 2: it exited 0, and a sequential sweep went on to its next job)."""
    from grpolab.app.run_folder import RunFolder

    out = tmp_path / "final"
    rc, output = _signal_at(out, "final validation at step 2", sig, group, "val.at_start=false",
                            "trainer.max_steps=2")
    assert rc == 128 + sig, output[-3000:]
    assert "its last validation is missing" in (RunFolder(out).status({"trainer": {"max_steps": 2}}).unfinished or "")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["signal"] == sig.name, summary
    assert summary["stopped_in"] == "final validation" and summary["steps"] == 2
    assert summary["val_history"] == []
    assert torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 2
    assert (out / "policy" / "model.safetensors").exists()
