"""The corrections screen (sweeps/corrections_small.yaml) composes into one factor per arm around the claim
sweeps' settings, every arm passes the checks a run makes before building a model, and sweeps/sweep_status.py
lists what a batch left to run."""

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from omegaconf import OmegaConf
from test_sweeps_notebook import compose_sweep, grid

from grpolab.config import GRPOConfig
from grpolab.rollout.settings import resolve_rollout

LOSSES = {"offpolicy_grpo": ("offpolicy_grpo", None), "ppo": ("ppo", None), "decoupled_ppo": ("decoupled_ppo", None),
          "decoupled_loglinear": ("decoupled_ppo", "loglinear"), "seq_is_mask": ("seq_is_mask", None),
          "geo_seq_mask": ("geo_seq_mask", None), "token_is_mask": ("token_is_mask", None), "cispo": ("cispo", None)}
# arm -> (k, clip_mode, proximal_policy, async, refresh, max_drift)
ARMS = {"onpolicy": (1, "ppo", None, False, "steps", None),
        **{f"k10_{n}": (10, c, p, False, "steps", None) for n, (c, p) in LOSSES.items()},
        **{f"async_{n}": (10, c, p, True, "steps", None) for n, (c, p) in LOSSES.items()},
        "adaptive_d03": (10, "offpolicy_grpo", None, False, "adaptive", 0.03),
        "adaptive_d06": (10, "offpolicy_grpo", None, False, "adaptive", 0.06),
        "adaptive_async_d03": (10, "offpolicy_grpo", None, True, "adaptive", 0.03),
        "adaptive_async_d06": (10, "offpolicy_grpo", None, True, "adaptive", 0.06)}


def _refresh(rules) -> tuple:
    """``("steps", None)`` for the step schedule alone, ``("adaptive", max_drift)`` for the drift rule alone (the arms'
    old spelling, rollout.refresh=adaptive rollout.max_drift=D), else the rules."""
    kinds = [(type(r).__name__, getattr(r, "every", None)) for r in rules]
    if kinds == [("EveryKSteps", None)]:
        return "steps", None
    return ("adaptive", rules[0].max_drift) if [k for k, _ in kinds] == ["DriftRefresh"] else (rules, None)


def test_the_screen_is_every_arm_at_claim_small_settings():
    cfg = compose_sweep("corrections_small", [])
    assert grid(cfg) == {"correction_arm": list(ARMS), "seed": ["0", "1", "2"]}
    claim = compose_sweep("claim_small", [])
    assert cfg.trainer.max_steps == claim.trainer.max_steps == 400
    assert cfg.trainer.val_check_interval == claim.trainer.val_check_interval
    assert cfg.final_eval == claim.final_eval and cfg.final_eval.num_samples == 16 and cfg.data.test_size == 1024
    assert cfg.model.seed == 0 and cfg.data.seed == 0 and cfg.callbacks.threads.num_threads == 1
    assert OmegaConf.to_container(cfg.algo) == OmegaConf.to_container(claim.algo)  # onpolicy is claim's k1


@pytest.mark.parametrize("task", [[], ["data=multistep"]])
@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_changes_one_factor_and_passes_the_checks(arm, task):
    cfg = compose_sweep("corrections_small", [f"correction_arm={arm}", "seed=2", *task])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))  # the loss variant's own checks
    _, _, settings = resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
    got = (algo.steps_per_generation, algo.clip_mode, algo.proximal_policy, settings.async_generation,
           *_refresh(settings.refresh_rules(algo)))
    assert got == ARMS[arm]
    assert algo.num_iterations == 1 and algo.mask_zero_std_groups == (arm != "onpolicy") and cfg.seed == 2
    assert algo.learning_rate == 1e-4 and algo.epsilon == 0.2
    if task:
        assert cfg.data._target_.endswith("MultiStepArithmeticTask") and cfg.data.test_size == 1024


def test_sweep_status_lists_what_is_left(tmp_path):
    for batch, arm, seed, summary in [("a", "onpolicy", 0, {"steps": 400}), ("a", "k10_ppo", 0, {"interrupted": True}),
                                      ("b", "k10_ppo", 1, None)]:
        job = tmp_path / batch / f"0_{arm}_{seed}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- correction_arm={arm}\n- seed={seed}\n")
        if summary is not None:
            (job / "summary.json").write_text(json.dumps(summary))
    out = subprocess.run([sys.executable, "sweeps/sweep_status.py", str(tmp_path), "correction_arm=onpolicy,k10_ppo",
                          "seed=0,1"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "finished step 400 correction_arm=onpolicy seed=0 (a/0_onpolicy_0)" in lines, out
    assert "interrupted step - correction_arm=k10_ppo seed=0 (a/0_k10_ppo_0)" in lines
    assert "running or killed step - correction_arm=k10_ppo seed=1 (b/0_k10_ppo_1)" in lines
    assert "not started step - correction_arm=onpolicy seed=1" in lines
    assert "1 finished, 1 interrupted, 1 running or killed, 1 not started" in lines
    assert lines[-1] == "correction_arm=onpolicy seed=1"  # the grid point no folder holds


def test_sweep_status_appends_finished_jobs_to_a_results_csv_once(tmp_path):
    import csv

    sweep, out = tmp_path / "sweep", tmp_path / "results.csv"
    for arm, seed, summary in [("onpolicy", 0, {"seed": 0, "steps": 400, "test_mean_at_16": 0.5}),
                               ("k10_ppo", 0, {"seed": 0, "interrupted": True}), ("k10_ppo", 1, None)]:
        job = sweep / f"0_{arm}_{seed}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- correction_arm={arm}\n- seed={seed}\n")
        if summary is not None:
            (job / "summary.json").write_text(json.dumps(summary))
    cmd = [sys.executable, "sweeps/sweep_status.py", str(sweep), "--csv", str(out), "correction_arm=onpolicy,k10_ppo",
           "seed=0,1"]
    for added in (1, 0):  # the second call finds the row already kept
        res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        assert f"{added} rows added to {out}" in res
    rows = list(csv.DictReader(out.open()))
    assert [(r["arm"], r["seed"], r["steps"], r["test_mean_at_16"]) for r in rows] == [("onpolicy", "0", "400", "0.5")]


def test_the_async_default_confirmation_is_grpo_async_against_onpolicy_at_1000_steps():
    cfg = compose_sweep("async_default", ["correction_arm=grpo_async"])
    assert grid(cfg) == {"correction_arm": ["onpolicy", "grpo_async"], "seed": ["0", "1", "2"]}
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    assert cfg.trainer.max_steps == 1000 and cfg.final_eval.num_samples == 16 and cfg.data.test_size == 1024
    assert (algo.name, algo.steps_per_generation, algo.clip_mode, cfg.rollout.async_generation) == (
        "grpo_async", 1, "ppo", True)


def test_the_confirmation_is_async_defaults_settings_with_the_screens_best_arms():
    base = compose_sweep("async_default", [])
    cfg = compose_sweep("corrections_confirm", [])
    assert grid(cfg) == {"correction_arm": ["onpolicy", "grpo_async", "k10_offpolicy_grpo", "k10_ppo", "k4_ppo"],
                         "seed": ["0", "1", "2", "3", "4"]}
    for key in ("trainer", "final_eval", "data", "model", "callbacks"):  # async_default's rows are this grid's too
        assert OmegaConf.to_container(cfg[key]) == OmegaConf.to_container(base[key]), key
    for arm, want in [("k10_ppo", (10, "ppo")), ("k4_ppo", (4, "ppo")), ("k10_offpolicy_grpo", (10, "offpolicy_grpo"))]:
        arm_cfg = compose_sweep("corrections_confirm", [f"correction_arm={arm}"])
        algo = GRPOConfig.from_dict(OmegaConf.to_container(arm_cfg.algo, resolve=True))
        assert (algo.steps_per_generation, algo.clip_mode, algo.num_iterations) == (*want, 1)
        assert algo.learning_rate == 1e-4 and arm_cfg.trainer.max_steps == 1000


def test_the_areal_sweep_is_the_screens_clip_arms_at_two_iterations():
    cfg = compose_sweep("corrections_i2", [])
    assert grid(cfg)["correction_arm"] == ["onpolicy", "k10_offpolicy_grpo", "k10_ppo", "k10_decoupled_ppo",
                                           "k10_decoupled_loglinear"]
    for arm in grid(cfg)["correction_arm"]:
        i2 = compose_sweep("corrections_i2", [f"correction_arm={arm}"])
        cli = compose_sweep("corrections_small", [f"correction_arm={arm}", "task_name=corrections_i2",
                                                  "algo.num_iterations=2"])
        assert OmegaConf.to_container(i2.algo) == OmegaConf.to_container(cli.algo)  # what the runs used
        algo = GRPOConfig.from_dict(OmegaConf.to_container(i2.algo, resolve=True))
        assert algo.num_iterations == 2 and algo.clip_mode == ARMS[arm][1] and algo.steps_per_generation == ARMS[arm][0]


def test_the_ablation_arms_change_one_factor_of_their_reference_arm():
    """k4_offpolicy_grpo is k10_offpolicy_grpo at k=4; grpo_async_noclip is grpo_async with epsilon 1e6."""
    for arm, ref, changed in [("k4_offpolicy_grpo", "k10_offpolicy_grpo", {"steps_per_generation": 4}),
                              ("grpo_async_noclip", "grpo_async", {"epsilon": 1e6})]:
        got = OmegaConf.to_container(compose_sweep("async_default", [f"correction_arm={arm}"]).algo, resolve=True)
        want = OmegaConf.to_container(compose_sweep("async_default", [f"correction_arm={ref}"]).algo, resolve=True)
        assert {k: v for k, v in got.items() if got[k] != want.get(k)} == changed, arm
        GRPOConfig.from_dict(got)  # the run's own checks accept it


def test_the_refresh_screens_two_stages_read_validation_then_test_on_other_warm_starts():
    """sweeps/refresh_screen_tune.yaml chooses each rule's threshold on the val split at the tuning warm start 3;
    sweeps/refresh_screen_test.yaml scores the chosen arms on the test split at warm starts 0-2, paired seeds."""
    tune, test = compose_sweep("refresh_screen_tune", []), compose_sweep("refresh_screen_test", [])
    assert tune.final_eval.split == "val" and test.final_eval.split == "test"
    assert tune.model.warmstart.seed == 3 and str(test.hydra.sweeper.params["model.warmstart.seed"]) == "0,1,2"
    assert str(test.hydra.sweeper.params.seed) == "0,1" and test.hydra.sweeper.params.correction_arm == "k10_ppo"
    assert tune.data.val_size == test.data.val_size == 1024 and tune.data.test_size == test.data.test_size
    assert tune.trainer.max_steps == test.trainer.max_steps == 1000 and test.algo.learning_rate == 1e-4
    arms = str(tune.hydra.sweeper.params.correction_arm).split(",")
    for arm in ["k10_ppo", *arms]:  # every arm stage 2 can name composes under stage 2's settings
        cfg = compose_sweep("refresh_screen_test", [f"correction_arm={arm}", "model.warmstart.seed=0", "seed=0"])
        assert cfg.algo.steps_per_generation == 10 and cfg.algo.clip_mode == "ppo", arm
