"""Checkpoints in the layouts of older versions resume bit-exact. Rewriting a checkpoint of this version into each
gives that file exactly.

* ``one_rule``: written before the refresh rules were a list (``rollout.refresh`` a string): the drift rule's counters
  under ``drift_refresh`` (``steps``, ``unused_minibatches``) instead of ``refresh_rules`` and ``unused_minibatches``,
  and no served log-ratios in the module's entry.
* ``drift_in_rollout``: also written before the module owned its reference refresh and its drift: ``drift`` and
  ``ref_refreshed_at`` (the step of the reference's last refresh) in the data module's state, no ``reference_version``
  in the module's entry nor in the saved minibatches, and the reference as of its last refresh before the saved step.
"""

from __future__ import annotations

import pandas as pd
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM

from grpolab.app.run import run_training

# k = 4, the reference refreshed every 3 steps, adaptive refresh with a bound that any move of the policy passes
# (rewards that vary by design, tests/certain_reward.py, so the policy moves at every step with a learning rate): the
# full run refreshes its reference at steps 3 and 6 and ends each buffer at its second trained step (lag 1, the first
# with a drift: step 0 trains at learning rate 0), at steps 3, 5 and 7.
COMMON = [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=4", "algo.beta=0.04",
          "algo.ref_refresh_every=3", "algo.learning_rate=1e-2", *varied(),
          "rollout.refresh=adaptive", "rollout.max_drift=1e-9", "trainer.max_steps=8",
          "trainer.val_check_interval=100", "val.at_start=false", "callbacks.model_checkpoint.every_n_train_steps=1",
          "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
          "callbacks.model_checkpoint.filename='step{step}'"]


def _old_layout(ckpt, out, layout):
    state = torch.load(ckpt, weights_only=False)
    module, rollout = state["grpolab"], state["RolloutDataModule"]
    module.pop("served"), module.pop("served_ranks")
    rules = rollout.pop("refresh_rules")
    rollout["drift_refresh"] = {"steps": rules["drift"]["steps"], "unused_minibatches": rollout.pop("unused_minibatches")}
    if layout == "drift_in_rollout":
        rollout["drift"] = module.pop("drift")
        module.pop("drift_ranks")
        rollout["ref_refreshed_at"] = module.pop("reference_version")
        for mb in rollout["buffer"]:
            del mb["reference_version"]
    torch.save(state, out)
    return out


def _policy(run):
    return AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()


def test_checkpoints_in_the_old_layouts_resume_exactly(tmp_path):
    full = run_training(compose_train_cfg(tmp_path / "full", COMMON))
    assert full["drift_refresh_steps"] == [3, 5, 7]
    expected = pd.read_csv(tmp_path / "full" / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
    # at the step whose early end is due; mid-buffer, at the step whose reference refresh is due
    for step, layout in ((5, "drift_in_rollout"), (6, "drift_in_rollout"), (5, "one_rule"), (6, "one_rule")):
        saved = torch.load(tmp_path / "full" / "checkpoints" / f"step{step}.ckpt", weights_only=False)
        assert saved["grpolab"]["reference_version"] == 3 and saved["grpolab"]["drift"] is not None
        assert saved["RolloutDataModule"]["refresh_rules"]["drift"]["steps"] == [3, 5][:1 + (step > 5)]
        old = _old_layout(tmp_path / "full" / "checkpoints" / f"step{step}.ckpt", tmp_path / f"{layout}{step}.ckpt",
                          layout)
        run = tmp_path / f"resumed_{layout}{step}"
        resumed = run_training(compose_train_cfg(run, [*COMMON, f"ckpt_path={old}"]))
        assert resumed["drift_refresh_steps"] == [3, 5, 7] and resumed["sampler_refreshes"] == full["sampler_refreshes"]
        assert resumed["unused_minibatches"] == full["unused_minibatches"]
        metrics = pd.read_csv(run / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")
        for column in ("train/loss", "train/kl", "train/rollout/drift", "train/lag"):
            assert metrics[column].equals(expected.loc[metrics.index, column]), (step, layout, column)
        a, b = _policy(tmp_path / "full"), _policy(run)
        assert all(torch.equal(a[k], b[k]) for k in a)
