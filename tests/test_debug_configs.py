"""``python src/train.py debug=<name>`` (conf/debug/, as lightning-hydra-template's): each option composes with what
it promises, and the short ones run end to end on the tiny fast model (fast_dev_run, the simple profiler)."""

from __future__ import annotations

from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

from grpolab.app.run import run_training

OPTIONS = sorted(p.stem for p in (REPO_ROOT / "conf" / "debug").glob("*.yaml"))


def test_every_debug_option_composes_with_its_settings(tmp_path):
    assert OPTIONS == ["default", "fdr", "profiler"]
    for name in OPTIONS:
        cfg = compose_train_cfg(tmp_path, [f"debug={name}"])
        assert cfg.task_name == "debug" and list(cfg.hydra.verbose) == ["grpolab"]
        assert cfg.trainer.detect_anomaly is (name != "profiler")  # anomaly mode would fill the profile
    default = compose_train_cfg(tmp_path, ["debug=default"])
    assert default.trainer.max_steps == 4 and default.callbacks.periodic_checkpoint.every_n_train_steps == 2
    assert compose_train_cfg(tmp_path, ["debug=fdr"]).trainer.fast_dev_run is True
    profiler = compose_train_cfg(tmp_path, ["debug=profiler"]).trainer.profiler
    assert profiler._target_ == "lightning.pytorch.profilers.SimpleProfiler" and profiler.filename == "profile"
    # the command line still wins over the debug config
    assert compose_train_cfg(tmp_path, ["debug=default", "trainer.max_steps=7"]).trainer.max_steps == 7


def test_debug_fdr_runs_one_step(tmp_path):
    summary = run_training(compose_train_cfg(tmp_path, ["debug=fdr", *FAST_OVERRIDES]))
    assert summary["steps"] == 1 and not summary["interrupted"]
    assert not (tmp_path / "metrics.csv").exists()  # fast_dev_run turns the loggers off


def test_debug_profiler_writes_the_profile_into_the_run_folder(tmp_path):
    overrides = ["debug=profiler", *FAST_OVERRIDES, "trainer.max_steps=2", "trainer.val_check_interval=2"]
    assert run_training(compose_train_cfg(tmp_path, overrides))["steps"] == 2
    profile = (tmp_path / "fit-profile.txt").read_text()
    assert "FIT Profiler Report" in profile and "run_training_batch" in profile
