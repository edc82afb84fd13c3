"""Wall-clock columns go on across a resume: the checkpoint keeps the run's elapsed and total seconds and the
resumed run adds its own to them (grpolab/run_clock.py), so accuracy-against-time curves of an interrupted or
requeued grid never go back in time. A real tiny run, resumed from its periodic checkpoint."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training
from grpolab.run_clock import RunClock

CKPT = ["callbacks.model_checkpoint.every_n_train_steps=4", "callbacks.model_checkpoint.monitor=null",
        "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'",
        "trainer.val_check_interval=100", "val.at_start=false", "trainer.max_steps=6"]
ELAPSED = "train/time/elapsed"


def _run(path, *overrides):
    summary = run_training(compose_train_cfg(path, [*FAST_OVERRIDES, *CKPT, *overrides]))
    metrics = pd.read_csv(path / "metrics.csv")
    return summary, metrics.dropna(subset=[ELAPSED]).set_index("step")[ELAPSED]


def test_the_time_columns_of_a_resumed_run_never_go_below_the_checkpoints(tmp_path):
    """Issue 39 (item 17): train/time/elapsed and time_total_s started again at 0 in a resumed run."""
    full, first = _run(tmp_path / "full")
    ckpt = tmp_path / "full" / "checkpoints" / "step4.ckpt"
    at_ckpt = first.loc[3]  # the row of optimizer step 4 (logged at global_step 3), the checkpoint's last step
    resumed, second = _run(tmp_path / "resumed", f"ckpt_path={ckpt}")
    assert resumed["steps"] == 6 and list(second.index) == [4, 5]
    assert (second >= at_ckpt).all() and second.is_monotonic_increasing, (first.to_dict(), second.to_dict())
    assert resumed["time_total_s"] >= at_ckpt
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["grpolab"]
    assert at_ckpt <= state["time_elapsed_s"] <= full["time_total_s"]  # saved after the step's row, within the run
    assert state["time_elapsed_s"] <= state["time_total_s"] <= resumed["time_total_s"]
    # the resumed steps take about as long as the uninterrupted run's: the time goes on from the checkpoint's
    assert second.loc[5] - state["time_elapsed_s"] == pytest.approx(first.loc[5] - first.loc[3], abs=5.0)


def test_a_clock_adds_the_checkpoints_seconds_to_its_own():
    clock = RunClock()
    clock.start_run(100.0)
    clock.start_fit(101.0)
    assert (clock.elapsed(103.5), clock.total(103.5)) == (2.5, 3.5)
    saved = clock.state_dict(104.0)
    assert saved == {"time_elapsed_s": 3.0, "time_total_s": 4.0}
    resumed = RunClock()
    resumed.load_state_dict(saved)
    resumed.start_run(500.0)
    resumed.start_fit(502.0)
    assert (resumed.elapsed(502.0), resumed.total(503.0)) == (3.0, 7.0)
    old = RunClock()
    old.load_state_dict({})  # a checkpoint from before the clock: its seconds are unknown, counted as 0
    assert old.elapsed() == 0.0 and old.total() == 0.0
