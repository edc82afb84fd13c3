"""grpolab/run_files.py: a run's JSON is written whole or not at all, and read back as "not finished" with one line
when it is not whole; the one decision "finished with every number it owes" on hand-written summaries."""

from __future__ import annotations

import json

import pytest

from grpolab import run_files
from grpolab.app import run_folder
from grpolab.app.run_folder import RunFolder


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    """Issue 39 (item 13): json.dump streams into the file; an object it cannot write stops it halfway. Written in
    place, the file would be cut there (what report.py then failed on); written atomically the old one stays."""
    path = tmp_path / "summary.json"
    run_files.write_json(path, {"steps": 10, "interrupted": False})
    old = path.read_bytes()
    with pytest.raises(TypeError):
        run_files.write_json(path, {"steps": 20, "val_history": [1, 2], "bad": object()})
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    run_files.write_json(path, {"steps": 20})
    assert json.loads(path.read_text()) == {"steps": 20}
    run_files.write_csv(tmp_path / "rows.csv", ["a", "b"], [{"a": 1, "b": 2, "c": 3}])
    assert (tmp_path / "rows.csv").read_bytes() == b"a,b\r\n1,2\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "summary.json"]


def test_an_unreadable_summary_is_not_finished_with_one_line_naming_it(tmp_path):
    (tmp_path / "summary.json").write_text('{"steps": 10, "interrupted": fa')
    status = RunFolder(tmp_path).status({"trainer": {"max_steps": 10}})
    assert not status.finished and status.summary is None
    assert status.warning.startswith(f"{tmp_path / 'summary.json'}: not valid JSON") and "\n" not in status.warning
    (tmp_path / "summary.json").write_text("[1, 2]")
    assert RunFolder(tmp_path).status({}).warning == f"{tmp_path / 'summary.json'}: not a JSON object: read as not finished"
    assert RunFolder(tmp_path / "none").status({}).unfinished == "no summary.json (failed or still running)"


@pytest.mark.parametrize("summary, reason", [
    ({"steps": 10, "interrupted": False, "test_mean_at_16": 0.5}, None),
    ({"steps": 10, "interrupted": True, "signal": "SIGTERM"}, "interrupted at step 10 (signal SIGTERM)"),
    ({"steps": 3, "interrupted": False, "failed": True, "failure": {"step": 3, "reason": "vLLM died"}},
     "failed at step 3: vLLM died"),
    ({"steps": 7, "interrupted": False, "test_mean_at_16": 0.5}, "stopped short, 7 of 10 steps"),
    ({"steps": 10, "interrupted": False, "test_mean_at_16": None, "signal": "SIGTERM", "stopped_in": "final eval"},
     "finished training but has no number for test_mean_at_16 (final eval stopped by SIGTERM)"),
    # issue 39 item 2: a stop in the final validation leaves val_accuracy_end at an earlier validation's number
    ({"steps": 10, "interrupted": False, "test_mean_at_16": 0.5, "val_history": [{"step": 0}, {"step": 10}]}, None),
    ({"steps": 10, "interrupted": False, "test_mean_at_16": None, "val_history": [{"step": 0}], "signal": "SIGINT",
      "stopped_in": "final validation"},
     "finished training but its last validation is at step 0, not at its last step 10 (final validation stopped by "
     "SIGINT)"),
    ({"steps": 10, "interrupted": False, "val_history": [], "signal": "SIGINT", "stopped_in": "final validation"},
     "finished training but its last validation is missing, not at its last step 10 (final validation stopped by "
     "SIGINT)"),
])
def test_finished_with_every_number_it_owes(summary, reason):
    config = {"trainer": {"max_steps": 10}, "final_eval": {"enabled": True, "split": "test", "num_samples": 16}}
    assert run_folder.unfinished_reason(summary, run_folder.max_steps_of(config), run_folder.owed_numbers(config)) == reason
    assert run_folder.owed_numbers({"final_eval": {"enabled": False}}) == []


def test_the_mean_of_the_last_steps_of_a_metrics_column(tmp_path):
    """Issue 42 (item 3): the final entropy of a run's training completions, from metrics.csv's train rows only."""
    assert RunFolder(tmp_path).train_tail_mean() is None  # no metrics.csv
    lines = ["epoch,step,train/entropy,val/accuracy", "0,0,0.9,", "0,0,,0.25", "0,1,0.5,", "0,2,nan,", "0,3,0.3,",
             "0,4,0.1,", "0,4,,0.5"]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert RunFolder(tmp_path).train_tail_mean(last=3) == pytest.approx((0.5 + 0.3 + 0.1) / 3)  # nan left out
    assert RunFolder(tmp_path).train_tail_mean(last=10) == pytest.approx((0.9 + 0.5 + 0.3 + 0.1) / 4)
    assert RunFolder(tmp_path).train_tail_mean("train/reward") is None
    (tmp_path / "metrics.csv").write_bytes(b"step,train/entropy\n\xff\xfe,0.1\n")
    assert RunFolder(tmp_path).train_tail_mean() is None
