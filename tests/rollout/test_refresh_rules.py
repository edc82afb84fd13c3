"""Refresh rules as an open interface (rollout.refresh, grpolab.rollout.rules): a rule defined in this folder only
(record_rule.py and conf/rollout/refresh/reward_record.yaml) is selected from the command line and trains, with no
edit in src/; rules compose (the buffer refreshes when any fires); a resume is exact with any mix of them, a buffer in
flight included; the old spellings still work; bad settings stop before any model, naming the key."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import forkrun
import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from grpolab.algo.metric_reduction import Rule, explicit_rule
from grpolab.app.preflight import preflight
from grpolab.app.run import run_training
from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.rollout.settings import resolve_rollout

HERE = Path(__file__).parent
CONF = HERE / "conf"  # conf/rollout/refresh/reward_record.yaml: the test rule's yaml
# k = 4, rewards that vary by design (tests/certain_reward.py) and a learning rate high enough for the tiny random model
# to move measurably in a step
COMMON = [*FAST_OVERRIDES, "algo=grpo_offpolicy", "algo.steps_per_generation=4", "algo.learning_rate=1e-2", *varied(),
          "trainer.val_check_interval=100", "val.at_start=false", f"hydra.searchpath=[file://{CONF}]"]
CHECKPOINTS = ["callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.model_checkpoint.monitor=null",
               "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'"]
# every rule at once: every 3 steps at the latest; drift past 100 (never: its metric is still logged); the ESS below
# 1 - 1e-5, which any step's move of the policy passes (a lag-0 or lag-1-after-step-0 minibatch reads exactly 1: same
# weights) and round-off does not; and the test folder's rule, a new record mean reward
MIX = ["rollout/refresh=[steps,drift,ess,reward_record]", "rollout.refresh.steps.every=3",
       "rollout.refresh.drift.max_drift=100", "rollout.refresh.ess.min_ess=0.99999"]
ASYNC = ["rollout=hf_copy", "rollout.async_generation=true"]
NOT_TIMING = ["train/lag", "train/loss", "train/reward", "train/tv_token", "train/rollout/drift", "train/rollout/ess",
              "train/rollout/served_reward", "train/rollout/steps_refreshes", "train/rollout/ess_refreshes",
              "train/rollout/drift_refreshes", "train/rollout/reward_record_refreshes"]
RULE_KEYS = ("steps_refresh_steps", "drift_refresh_steps", "ess_refresh_steps", "reward_record_refresh_steps",
             "reward_record_best", "sampler_refreshes", "unused_minibatches", "weight_syncs", "completions")


def _run(out, *overrides):
    summary = run_training(compose_train_cfg(out, [*COMMON, *overrides]))
    return summary, pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"]).set_index("step")


def _policy(run):
    return AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()


def test_a_rule_from_the_test_folder_is_chosen_on_the_command_line(tmp_path):
    """python src/train.py, as a user runs it: the rule's module on PYTHONPATH, its yaml on Hydra's search path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT / "tests")]), "OMP_NUM_THREADS": "1",
           "GRPOLAB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "src/train.py", *COMMON, "trainer.max_steps=4", f"hydra.run.dir={tmp_path}",
           "rollout/refresh=[steps,reward_record]"]
    res = forkrun.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["refresh_rules"] == ["steps", "reward_record"] and summary["refresh"] == "adaptive"
    # it reads step 0's minibatch before step 1, a record by definition (the first read), at a minibatch boundary
    assert summary["reward_record_refresh_steps"][0] == 1 and summary["sampler_refreshes"] >= 2
    metrics = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    assert metrics["train/rollout/served_reward"].iloc[1:].between(0, 1).all()  # the served rewards, pooled
    assert metrics["train/rollout/reward_record_refreshes"].iloc[-1] == summary["reward_record_refreshes"]
    # its metrics declared how they combine over ranks when the class was defined (imported by the run)
    import record_rule  # noqa: F401  the module the run imported (this folder is on sys.path under pytest)

    assert explicit_rule("train/rollout/served_reward") == Rule("max")
    assert explicit_rule("train/rollout/reward_record_refreshes") == Rule("max")


@pytest.mark.parametrize("rollout", [[], ASYNC], ids=["sync", "async"])
def test_resume_with_every_rule_at_once_is_exact(tmp_path, rollout):
    full_summary, full = _run(tmp_path / "full", *rollout, *MIX, *CHECKPOINTS, "trainer.max_steps=10")
    fired = [k for k in ("steps", "ess", "reward_record") if full_summary[f"{k}_refresh_steps"]]
    assert len(fired) >= 2, {k: full_summary[f"{k}_refresh_steps"] for k in ("steps", "ess", "reward_record")}
    assert full_summary["drift_refreshes"] == 0 and full["train/rollout/drift"].notna().sum() >= 8
    if not rollout:
        assert full["train/lag"].max() <= 2  # every 3 steps at the latest
    # resume inside a buffer (position >= 1): with async generation, one whose next buffer is in flight
    ckpts = sorted((tmp_path / "full" / "checkpoints").glob("step*.ckpt"), key=lambda p: int(p.stem[4:]))
    states = {p: torch.load(p, weights_only=False)["RolloutDataModule"] for p in ckpts}
    inside = [p for p, s in states.items() if s["position"] >= 1 and (s["in_flight"] is not None or not rollout)
              and 3 <= int(p.stem[4:]) <= 7]
    assert inside, {p.stem: (s["position"], s["in_flight"] is not None) for p, s in states.items()}
    ckpt = inside[0]
    assert set(states[ckpt]["refresh_rules"]) == {"steps", "drift", "ess", "reward_record"}
    summary, resumed = _run(tmp_path / "resumed", *rollout, *MIX, *CHECKPOINTS, "trainer.max_steps=10",
                            f"ckpt_path={ckpt}")
    for key in RULE_KEYS:
        assert summary[key] == full_summary[key], key
    columns = [c for c in NOT_TIMING if c in full.columns]
    pd.testing.assert_frame_equal(full.loc[resumed.index, columns], resumed[columns])
    a, b = _policy(tmp_path / "full"), _policy(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _rules(*overrides):
    cfg = compose_train_cfg(Path("/unused"), [*COMMON, *overrides])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    _, _, settings = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    return [(type(r).__name__, {k: v for k, v in vars(r).items() if not k.startswith("_")})
            for r in settings.refresh_rules(algo)]


def test_the_old_spellings_are_the_rules_they_name():
    old = _rules("rollout.refresh=adaptive", "rollout.max_drift=0.03")
    assert old == _rules("rollout/refresh=drift", "rollout.refresh.drift.max_drift=0.03")
    assert old[0][0] == "DriftRefresh" and old[0][1]["max_drift"] == 0.03
    assert _rules("rollout.refresh=steps") == _rules() == [("EveryKSteps", {"every": None})]
    assert _rules("rollout/refresh=[]") == []  # no rule: every k steps, the buffer's length
    assert [name for name, _ in _rules("rollout/refresh=[ess,drift]")] == ["EssRefresh", "DriftRefresh"]


@pytest.mark.parametrize("overrides,message", [
    (["rollout/refresh=ess", "rollout.refresh.ess.min_ess=1.5"], r"^rollout\.refresh\.ess\.min_ess must be a number in \(0, 1\)"),
    (["rollout/refresh=ess", "rollout.refresh.ess.level=group"], r"^rollout\.refresh\.ess\.level must be one of token, sequence"),
    (["rollout/refresh=ess", "rollout.refresh.ess.min_ess=abc"], r"rollout\.refresh\.ess\.min_ess must be a number"),
    (["rollout/refresh=ess", "+rollout.refresh.ess.window=3"], r"^rollout\.refresh\.ess: .*unexpected keyword argument 'window'"),
    (["rollout/refresh=ess", "algo.steps_per_generation=1"],
     r"^rollout\.refresh\.ess ends a buffer early, so it needs algo\.steps_per_generation >= 2"),
    (["rollout.refresh.steps.every=3", "algo.num_iterations=2"],
     r"^rollout\.refresh\.steps\.every must be a multiple of algo\.num_iterations=2"),
    (["rollout/refresh=[ess,drift]", "+rollout.refresh.more._target_=grpolab.rollout.rules.ess.EssRefresh",
      "+rollout.refresh.more.min_ess=0.5"], r"rollout\.refresh\.ess and rollout\.refresh\.more are both the refresh rule 'ess'"),
    (["+rollout.refresh.drift.max_drift=0.1"], r"^rollout\.refresh\.drift is not a rule node with a _target_.*rollout/refresh="),
    (["+rollout.refresh.x._target_=grpolab.rollout.rules.base.RefreshRecord"], r"is not a grpolab\.rollout\.rules\.base\.RefreshRule"),
    (["+rollout.refresh.x._target_=grpolab.rollout.rules.base.RefreshRule"], r"^rollout\.refresh\.x\._target_=.* has no name"),
    (["rollout.refresh=drift"], r"^rollout\.refresh=drift: choose refresh rules with rollout/refresh=\[drift\]"),
    (["rollout/refresh=drift", "rollout.max_drift=0.1"], r"^rollout\.max_drift is read by rollout\.refresh=adaptive only"),
])
def test_bad_rule_settings_stop_before_any_model_naming_the_key(tmp_path, overrides, message):
    cfg = compose_train_cfg(tmp_path, [*COMMON, *overrides])
    with pytest.raises(ConfigError, match=message):
        preflight(cfg)  # what src/train.py runs first: one line, exit 2
    assert not (tmp_path / "cache").exists()


def test_the_data_module_names_no_rule():
    text = (REPO_ROOT / "src" / "grpolab" / "rollout" / "datamodule.py").read_text()
    assert not re.search(r"drift|\bess\b|adaptive|EveryKSteps|DriftRefresh|EssRefresh", text, re.IGNORECASE)


def test_a_key_of_a_rule_not_chosen_says_how_to_choose_it():
    from grpolab.app.cli import unknown_overrides  # what src/train.py checks first: one line, exit 2

    [message] = unknown_overrides(REPO_ROOT / "conf", "train", ["rollout.refresh.drift.max_drift=0.1"])
    assert message.startswith("rollout.refresh.drift.max_drift: rollout.refresh.drift is the option drift of the "
                              "config group rollout/refresh, which the run did not choose: choose it with "
                              "rollout/refresh=drift")
    assert unknown_overrides(REPO_ROOT / "conf", "train", ["rollout/refresh=drift", "rollout.refresh.drift.max_drift=0.1"]) == []
    [typo] = unknown_overrides(REPO_ROOT / "conf", "train", ["rollout/refresh=drift", "rollout.refresh.drift.max_drif=0.1"])
    assert typo.endswith("did you mean rollout.refresh.drift.max_drift?")
