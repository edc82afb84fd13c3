"""Per-step metrics go straight to the loggers with Lightning's step index and log_every_n_steps rule."""

import pandas as pd
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.run import build


def test_step_metrics_follow_log_every_n_steps(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=4", "trainer.log_every_n_steps=2",
                                       "val.at_start=false", "trainer.val_check_interval=4"])
    parts = build(cfg)
    trainer = parts["trainer"]
    trainer.fit(parts["module"], datamodule=parts["datamodule"])
    for logger in trainer.loggers:
        logger.save()
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    train = metrics.dropna(subset=["train/loss"])
    # Lightning logs step s when (s + 1) % log_every_n_steps == 0; steps are 0-based batch indices.
    assert train["step"].tolist() == [1, 3]
    assert train["epoch"].notna().all() and train["train/entropy"].gt(0).all()
    assert metrics["val/accuracy"].notna().sum() == 1
    # Callbacks (progress bar, monitors) still see the step metrics, as with log_dict.
    assert {"train/reward", "train/loss", "val/accuracy"} <= set(trainer.callback_metrics)
