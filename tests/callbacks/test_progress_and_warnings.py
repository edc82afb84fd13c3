"""What a user sees: the progress bar counts optimizer steps, and the log has no warning we cause.

The run is the real command line. Lightning warns about loader workers only on machines with more than 2
CPUs, so the child process reports 8 suggested workers (as on a 16-core GPU host) to make the check
meaningful on any machine.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FAST_OVERRIDES, REPO_ROOT

_CHILD = """
import runpy, sys
import lightning.pytorch.trainer.connectors.data_connector as dc
dc.suggested_max_num_workers = lambda num_devices: 8  # as on a 16-core host
sys.argv = ["src/train.py", *sys.argv[1:]]
runpy.run_path("src/train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_bar_shows_steps_and_the_log_has_no_warnings_we_cause(tmp_path):
    overrides = [o for o in FAST_OVERRIDES if not o.startswith("trainer.enable_progress_bar")]
    cmd = [sys.executable, "-c", _CHILD, "trainer.max_steps=3", *overrides, f"hydra.run.dir={tmp_path}",
           f"paths.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, err = proc.stdout, proc.stderr
    for ours in ("PossibleUserWarning", "does not have many workers", "exists and is not empty",
                 "Trying to infer the `batch_size`"):
        assert ours not in err and ours not in out, f"{ours!r} in the log:\n{err[-3000:]}"
    frames = out.replace("\r", "\n").splitlines()
    bar = [line for line in frames if line.startswith("GRPO step")]
    assert bar, out[-2000:]
    assert "3/3" in bar[-1] and "reward=" in bar[-1] and "val_acc=" in bar[-1] and "steps/s=" in bar[-1]
    assert "Epoch 0/-2" not in out and "Epoch 0/-2" not in err


# A resumed run's bar (Lightning skips on_train_epoch_start when resuming mid-epoch) is checked on the resumed run
# of tests/test_interrupt.py, which resumes a real Ctrl-C checkpoint with the bar on.
