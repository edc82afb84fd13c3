"""Per-step metrics go straight to the loggers with Lightning's step index, epoch column and log_every_n_steps
rule (grpolab.callbacks.step_logging), identical to what ``log_dict(on_step=True, on_epoch=False)`` writes."""

import lightning as L
import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from grpolab.algo.metric_reduction import explicit_rule
from grpolab.algo.sampling_correction import sampling_mismatch_metrics
from grpolab.app.run import build
from grpolab.callbacks.step_logging import log_step_metrics


class _Logs(L.LightningModule):
    """One manual optimizer step per batch (as GRPOModule), logging a few values either way."""

    def __init__(self, direct: bool) -> None:
        super().__init__()
        self.direct = direct
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        step = self.global_step  # before opt.step(), as GRPOModule reads it
        opt = self.optimizers()
        loss = self.layer(batch).pow(2).mean()
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()
        # dyadic values: log_dict stores float32 tensors, so only these are written alike by both paths
        metrics = {"train/a": step * 0.25, "train/b/c": batch_idx + 0.5, "train/d": 2.0 ** -step}
        if self.direct:
            log_step_metrics(self.trainer, metrics, step)
        else:
            self.log_dict(metrics, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(12, 2, generator=torch.Generator().manual_seed(0)), batch_size=2)


def _fit(path, direct: bool, **trainer_kwargs) -> tuple[pd.DataFrame | None, L.Trainer]:
    trainer = L.Trainer(accelerator="cpu", logger=CSVLogger(path, name="", version=""), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **trainer_kwargs)
    trainer.fit(_Logs(direct))
    csv = path / "metrics.csv"
    return (pd.read_csv(csv) if csv.is_file() else None), trainer


@pytest.mark.parametrize("kwargs", [dict(max_epochs=2, log_every_n_steps=4), dict(max_steps=9, log_every_n_steps=1),
                                    dict(max_epochs=1, log_every_n_steps=0)], ids=["every4_2epochs", "every1", "never"])
def test_same_csv_as_log_dict(tmp_path, kwargs):
    ref, ref_trainer = _fit(tmp_path / "log_dict", False, **kwargs)
    got, trainer = _fit(tmp_path / "direct", True, **kwargs)
    if kwargs["log_every_n_steps"]:  # the check has rows to compare, over two epochs (6 batches each)
        assert len(ref) > 1 and ref["epoch"].nunique() == 2
        assert list(got.columns) == list(ref.columns)
        pd.testing.assert_frame_equal(got, ref)
    else:  # log_every_n_steps=0: neither writes a row
        assert got is None and ref is None
    assert {k: float(v) for k, v in trainer.callback_metrics.items()} == \
        {k: float(v) for k, v in ref_trainer.callback_metrics.items()}
    assert {k: float(v) for k, v in trainer.logged_metrics.items()} == \
        {k: float(v) for k, v in ref_trainer.logged_metrics.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("run")
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=4", "trainer.log_every_n_steps=2",
                                       "val.at_start=false", "trainer.val_check_interval=4", "algo.beta=0.04",
                                       "algo.lower_bound_every=1"])
    parts = build(cfg)
    trainer = parts["trainer"]
    trainer.fit(parts["module"], datamodule=parts["datamodule"])
    for logger in trainer.loggers:
        logger.save()
    return pd.read_csv(tmp_path / "metrics.csv"), trainer


def test_step_metrics_follow_log_every_n_steps(run):
    metrics, trainer = run
    train = metrics.dropna(subset=["train/loss"])
    # Lightning logs step s when (s + 1) % log_every_n_steps == 0; steps are 0-based batch indices.
    assert train["step"].tolist() == [1, 3]
    assert train["epoch"].notna().all() and train["train/entropy"].gt(0).all()
    assert metrics["val/accuracy"].notna().sum() == 1
    # Callbacks (progress bar, monitors) still see the step metrics, as with log_dict.
    assert {"train/reward", "train/loss", "val/accuracy"} <= set(trainer.callback_metrics)


def test_validation_rows_count_steps_done_like_summary_json(run):
    """A validation after 4 optimizer steps is written at step 4 (``val_history``'s and ``summary.json``'s
    numbering), not at Lightning's 3."""
    metrics, trainer = run
    val = metrics.dropna(subset=["val/accuracy"])
    assert val["step"].tolist() == [4] == [h["step"] for h in trainer.lightning_module.val_history]
    assert val["epoch"].notna().all()


def test_every_logged_step_metric_declares_how_it_combines_over_ranks(run):
    metrics, _ = run
    names = {c for c in metrics.columns if c.startswith("train/")}
    # the engine's mismatch metrics appear with rollout=vllm only
    names |= {f"train/{k}" for k in sampling_mismatch_metrics(torch.zeros(1, 1), torch.zeros(1, 1),
                                                               torch.ones(1, 1))}
    assert {"train/kl", "train/lower_bound", "train/rewards/exact/mean", "train/ratio/anchor_q99"} <= names
    # the fallback (a row-weighted mean) is wrong for token means, maxima and counts: no metric relies on it
    assert sorted(n for n in names if explicit_rule(n) is None) == []
