"""AReaL's setting: several updates per minibatch (algo.num_iterations > 1). Every off-policy correction trains
there, and its window, which cannot bind at a minibatch's first use (the ratio to the proximal policy or to the
sampler is exactly 1 on-policy), binds from the second update on (Fu et al. 2025, AReaL, section 5 and Table 3:
decoupled PPO takes several minibatch updates per batch)."""

import pandas as pd
import pytest
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training

# k = 1, i = 4: one minibatch, sampled by the policy itself, used for 4 updates (lag 0..3). A learning rate that
# moves the tiny random model within one update, and a narrow window (eps 0.02) so a moved token leaves it.
COMMON = [*FAST_OVERRIDES, "algo=grpo_reuse", "algo.num_iterations=4", "trainer.max_steps=4", "algo.learning_rate=1e-2",
          "algo.lr_scheduler.num_warmup_steps=0", "algo.epsilon=0.02", *varied(), "trainer.val_check_interval=100",
          "val.at_start=false", "final_eval.enabled=false"]
VARIANTS = {"offpolicy_grpo": [], "decoupled_ppo": [], "decoupled_loglinear": ["algo.proximal_policy=loglinear"],
            "seq_is_mask": [], "geo_seq_mask": [], "token_is_mask": [], "cispo": [], "ppo": []}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_correction_trains_at_i_gt_1_and_its_window_binds_from_the_second_update(tmp_path, variant):
    clip_mode = "decoupled_ppo" if variant == "decoupled_loglinear" else variant
    summary = run_training(compose_train_cfg(tmp_path, [*COMMON, f"algo.clip_mode={clip_mode}", *VARIANTS[variant]]))
    m = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)
    assert summary["steps"] == 4 and summary["sampler_refreshes"] == 1  # one minibatch, four updates
    assert m["train/iteration"].tolist() == [0, 1, 2, 3] and m["train/lag"].tolist() == [0, 1, 2, 3]
    clipped = m["train/clip_ratio/region_mean"].tolist()
    assert clipped[0] == 0.0  # first use: every ratio is exactly 1
    assert max(clipped[1:]) > 0.0, clipped  # from the second update on, tokens leave the window
    assert m["train/loss"].notna().all()
