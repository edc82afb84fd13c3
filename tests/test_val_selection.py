"""Selection apart from evaluation (tune on val, report on test): a run can score its final policy on a large val split
(``final_eval.split=val`` -> ``val_mean_at_<n>`` in summary.json, what the tuning sweep selects on) while its
periodic validation stays on the first ``val.max_prompts`` val prompts; the val and test prompts are disjoint."""

import json

import pytest
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import build, run_training
from grpolab.errors import ConfigError

SELECT = [*FAST_OVERRIDES, "data.val_size=12", "val.max_prompts=4", "final_eval.enabled=true", "final_eval.split=val",
          "final_eval.num_samples=2", "trainer.max_steps=2", "trainer.val_check_interval=100", "save_policy=false"]


def test_final_val_score_on_the_whole_val_split_and_periodic_validation_on_its_head(tmp_path):
    cfg = compose_train_cfg(tmp_path, SELECT)
    parts = build(cfg)
    dm = parts["datamodule"]
    splits = dm.task.splits()
    periodic = [row for batch in dm.val_dataloader() for row in batch]
    assert [r["uid"] for r in periodic] == [r["uid"] for r in splits["val"][:4]]  # val[:4] of val_size=12
    assert not {r["uid"] for r in splits["val"]} & {r["uid"] for r in splits["test"]}

    summary = run_training(compose_train_cfg(tmp_path / "run", SELECT))
    assert summary["val_num_prompts"] == 12 and 0.0 <= summary["val_mean_at_2"] <= 1.0
    assert "test_mean_at_2" not in summary  # selection never touches the test split
    final = json.loads((tmp_path / "run" / "final_eval.json").read_text())
    assert set(final["per_prompt"]) == {r["uid"] for r in splits["val"]}


@pytest.mark.parametrize("value", ["0", "abc"])
def test_bad_val_max_prompts_names_the_key(tmp_path, value):
    with pytest.raises((ConfigError, ValueError), match="val.max_prompts"):
        build(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, f"val.max_prompts={value}"]))
