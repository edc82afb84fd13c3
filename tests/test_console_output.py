"""What a run prints for a person: Lightning's lines once, no warning that reads like a bug, one human closing line."""
from __future__ import annotations

import subprocess
import sys

from conftest import FAST_OVERRIDES, REPO_ROOT


def test_a_run_prints_lightnings_lines_once_and_ends_with_one_human_line(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "src/train.py", *FAST_OVERRIDES, "trainer.max_steps=4",
         "callbacks.periodic_checkpoint.every_n_train_steps=2", f"hydra.run.dir={out}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout + proc.stderr
    assert (out / "checkpoints" / "step2.ckpt").exists()  # a periodic save ran (the warning's trigger)
    assert "pre-optimization state" not in text  # Lightning's manual-optimization checkpoint warning
    assert "Tip:" not in text
    assert text.count("Seed set to 0") == 1  # Lightning's console handler and Hydra's root handler: once
    assert "summary: {" not in text  # the JSON is in summary.json, not on the console
    last = [line for line in proc.stdout.splitlines() if "[grpolab][INFO]" in line][-1]
    assert "done: 4 steps in " in last and " s of it training; the rest builds" in last  # a warm start's wait is not training
    assert "held-out accuracy " in last and " -> " in last
    assert f"policy: {out / 'policy'}" in last and f"summary: {out / 'summary.json'}" in last
    assert "Seed set to 0" in (out / "train.log").read_text()  # the file log still has Lightning's lines
