"""``logger=wandb`` logs the composed config and continues one W&B run across resumes: a real short run, then a
resume by hand (``ckpt_path=``, a new run folder) end up in the same W&B run id with the config, read back from
the offline run files (conf/logger/wandb.yaml, grpolab/callbacks/wandb_logger.py)."""

from __future__ import annotations

from conftest import FAST_OVERRIDES, compose_train_cfg
from wandb_records import run_summary

from grpolab.app.run import run_training
from grpolab.callbacks.wandb_logger import RUN_ID_FILE, read_run_id, run_id

COMMON = [*FAST_OVERRIDES, "logger=wandb", "val.at_start=false", "trainer.val_check_interval=100",
          "save_policy=false"]


def _offline_run(run_dir):
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return run_summary(path)


def _steps(run, key):
    return [row["trainer/global_step"] for row in run["history"] if key in row]


def test_a_resumed_run_continues_the_same_wandb_run_with_the_config(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        run_training(compose_train_cfg(tmp_path / "first", [*COMMON, "trainer.max_steps=2"]))
        last = tmp_path / "first" / "checkpoints" / "last.ckpt"
        run_training(compose_train_cfg(tmp_path / "resumed", [*COMMON, "trainer.max_steps=4", f"ckpt_path={last}"]))
    finally:
        wandb.finish()
        # the offline run file is written by W&B's service process: finish() can return before its last records
        # are on disk (under load the resumed run's file once held its header only, and read as a run without id);
        # teardown waits for the service to exit, files flushed
        wandb.teardown()
    first, resumed = _offline_run(tmp_path / "first"), _offline_run(tmp_path / "resumed")
    kept = read_run_id(tmp_path / "first")
    assert kept and first["id"] == resumed["id"] == kept == read_run_id(tmp_path / "resumed")
    for run, max_steps in ((first, 2), (resumed, 4)):
        assert run["config"]["trainer/max_steps"] == max_steps  # flattened like Lightning's log_hyperparams
        assert run["config"]["algo/learning_rate"] == 1e-4 and run["config"]["model/hidden_size"] == 32
        assert "hydra/run/dir" not in run["config"]
    # one history: trainer/global_step goes on where the checkpoint stopped
    assert _steps(first, "train/loss") == [0, 1] and _steps(resumed, "train/loss") == [2, 3]
    assert _steps(first, "val/accuracy") == [2] and _steps(resumed, "val/accuracy") == [4]


def test_the_id_is_kept_in_the_run_folder_and_read_back_on_resume(tmp_path):
    first = run_id(tmp_path / "a")
    assert (tmp_path / "a" / RUN_ID_FILE).read_text().strip() == first
    # a rerun into the same folder (multirun, requeued SLURM job) and a resume into a new one continue it
    assert run_id(tmp_path / "a", tmp_path / "a" / "checkpoints" / "last.ckpt") == first
    assert run_id(tmp_path / "b", tmp_path / "a" / "checkpoints" / "last.ckpt") == first
    assert read_run_id(tmp_path / "b") == first
    # a fresh run into a used folder, and a resume of a run that kept no id, start a new W&B run
    assert run_id(tmp_path / "a") != first
    assert run_id(tmp_path / "c", tmp_path / "csv_only" / "checkpoints" / "last.ckpt") not in (None, first)
