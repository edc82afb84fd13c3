"""The completions callback (JSONL + W&B table) and the W&B logger factory (tags, one run per job, offline)."""

import json
import math

import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.callbacks.completions import COLUMNS, CompletionsLogger, completion_rows
from grpolab.rollout.buffer import Minibatch


def _minibatch():
    b = 4
    return Minibatch(
        prompt_ids=torch.zeros(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.long),
        completion_ids=torch.zeros(b, 3, dtype=torch.long), completion_mask=torch.ones(b, 3, dtype=torch.bool),
        truncated=torch.tensor([False, True, False, False]), group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.tensor([1.0, 0.0, float("nan"), 0.0]), advantages=torch.tensor([0.7, -0.7, 0.0, 0.0]),
        zero_std=torch.tensor([False, False, True, True]), loss_mask=torch.ones(b, 3), index=1, iteration=1, lag=2,
        info={"uids": ["a", "a", "b", "b"], "prompts": ["1+1=", "1+1=", "2+2=", "2+2="],
              "completions": ["2", "3", "4", "5"], "answers": ["2", "2", "4", "4"]},
    )


def test_completion_rows():
    rows = completion_rows(_minibatch(), step=7)
    assert [r["completion"] for r in rows] == ["2", "3", "4", "5"] and set(rows[0]) == set(COLUMNS)
    assert rows[0] == {"step": 7, "uid": "a", "prompt": "1+1=", "completion": "2", "gold": "2", "reward": 1.0,
                       "advantage": pytest.approx(0.7), "truncated": False, "lag": 2, "iteration": 1}
    assert rows[2]["reward"] is None  # unscorable, not NaN, so the JSONL stays strict JSON
    assert len(completion_rows(_minibatch(), step=7, max_rows=2)) == 2


def test_schedule_and_validation():
    cb = CompletionsLogger(every_n_steps=3)
    assert [s for s in range(1, 10) if cb.due(s)] == [1, 3, 6, 9]
    for kwargs in ({"every_n_steps": 0}, {"max_rows": 0}):
        with pytest.raises(ValueError):
            CompletionsLogger(**kwargs)


def test_training_run_logs_completions_to_jsonl_and_a_wandb_table(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=2",
                                       "seed=3", "trainer.max_steps=3", "trainer.val_check_interval=3",
                                       "logger=wandb", "callbacks.completions.every_n_steps=2",
                                       "callbacks.completions.max_rows=4", "save_policy=false"])
    from grpolab.app.run import run_training

    try:
        run_training(cfg)
        run = wandb.run
        assert run is not None and run.offline
        assert list(run.tags)[:5] == ["algo=grpo_offpolicy", "k=2", "i=1", "mask=True", "seed=3"]
        assert run.group.startswith("train-") and run.name == "grpo_offpolicy-k2-i1-s3"
    finally:
        wandb.finish()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4  # steps 1 and 2 of 3, 4 rows each
    assert [r["lag"] for r in rows] == [0] * 4 + [1] * 4
    assert all(isinstance(r["advantage"], float) and not math.isnan(r["advantage"]) for r in rows)
    tables = sorted((tmp_path / "wandb").glob("offline-run-*/files/media/table/completions_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[0].read_text())
    assert table["columns"] == COLUMNS and len(table["data"]) == 4


def test_a_new_wandb_logger_finishes_the_previous_jobs_run(tmp_path, monkeypatch):
    import wandb

    from grpolab.callbacks.wandb_logger import wandb_logger

    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        first = wandb_logger(tags=["mine", "k=1"], auto_tags=["k=1"], project="t", offline=True, save_dir=str(tmp_path),
                             override_tags=False)  # no Hydra job here: only the given tags
        run1 = first.experiment
        assert list(run1.tags) == ["k=1", "mine"]  # de-duplicated, automatic tags first
        second = wandb_logger(project="t", offline=True, save_dir=str(tmp_path))
        assert wandb.run is None  # the first job's run was closed, not reused
        assert second.experiment.id != run1.id
    finally:
        wandb.finish()


def test_torch_threads_callback_sets_and_validates():
    from grpolab.callbacks.threads import TorchThreads

    before = torch.get_num_threads()
    try:
        TorchThreads(1).setup(None, None, "fit")
        assert torch.get_num_threads() == 1
        TorchThreads(None).setup(None, None, "fit")  # None keeps the current setting
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="num_threads"):
        TorchThreads(0)
