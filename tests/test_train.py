"""End-to-end: the real training entry point on a small tiny model, per algo config, plus resume and NaN."""

import json

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpolab.app.run import build, run_training
from grpolab.module import NonFiniteLossError


def _run(tmp_path, *overrides):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *overrides])
    summary = run_training(cfg)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    return summary, metrics


@pytest.mark.parametrize(
    "algo,steps,refreshes",
    [("grpo_onpolicy", 4, 4), ("grpo_offpolicy", 4, 1), ("grpo_reuse", 4, 1), ("grpo_async", 4, 4)],
)
def test_each_algo_runs_and_refreshes_the_sampler_on_schedule(tmp_path, algo, steps, refreshes):
    # rewards that vary within every group by design (tests/certain_reward.py): the policy learns at every step.
    summary, metrics = _run(tmp_path, f"algo={algo}", f"trainer.max_steps={steps}", "trainer.val_check_interval=4",
                            *varied(), "algo.learning_rate=1e-3")
    assert summary["steps"] == steps and summary["sampler_refreshes"] == refreshes
    assert json.loads((tmp_path / "summary.json").read_text())["algo"] == algo
    train = metrics.dropna(subset=["train/loss"])
    assert len(train) == steps
    if algo == "grpo_onpolicy":
        # k = 1, i = 1: the ratio against the sampler is exactly 1 (old log-probs = current, detached).
        assert (train["train/ratio/mean"] == 1.0).all() and (train["train/lag"] == 0).all()
    if algo == "grpo_offpolicy":
        assert train["train/lag"].tolist() == [0, 1, 2, 3]
        # lag 0: policy == sampler up to float noise; afterwards the policy has moved away from the sampler.
        assert abs(train["train/ratio/mean"].iloc[0] - 1.0) < 1e-5
        assert train["train/tv_token"].iloc[0] < 1e-5 and train["train/tv_token"].iloc[3] > 0
    if algo == "grpo_async":  # buffer r+1 sampled from the weights of step r while step r trains: lag 1 after the first
        assert summary["async_generation"] is True and train["train/lag"].tolist() == [0, 1, 1, 1]
    if algo == "grpo_reuse":
        # lag counts optimizer steps since the sampler refresh, so it follows the inner iteration
        assert train["train/iteration"].tolist() == [0, 1, 2, 3] and train["train/lag"].tolist() == [0, 1, 2, 3]
        assert abs(train["train/ratio/mean"].iloc[0] - 1.0) < 1e-5
    for col in ("val/accuracy", "val/greedy_accuracy"):
        assert metrics[col].notna().sum() >= 2  # before training and at the end
    # The saved policy is a plain Hugging Face model that loads and generates.
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(tmp_path / "policy")
    out = model.generate(**tok("12+34=", return_tensors="pt"), max_new_tokens=3, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert out.shape == (1, 9) or out.shape[1] <= 9


def test_resume_mid_buffer_is_exact(tmp_path):
    # k = 3 with a checkpoint at step 4 (inside the second buffer): resuming from it must reproduce the
    # uninterrupted run's final weights, so the buffer, its position and the prompt order are all restored.
    common = ["algo=grpo_offpolicy", "algo.steps_per_generation=3", "trainer.val_check_interval=100",
              "val.at_start=false", "callbacks.model_checkpoint.every_n_train_steps=4",
              "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
              "callbacks.model_checkpoint.filename='step{step}'"]
    full = tmp_path / "full"
    _run(full, *common, "trainer.max_steps=6")
    ckpt = full / "checkpoints" / "step4.ckpt"
    assert ckpt.exists()
    resumed = tmp_path / "resumed"
    summary, _ = _run(resumed, *common, "trainer.max_steps=6", f"ckpt_path={ckpt}")
    assert summary["steps"] == 6 and summary["sampler_refreshes"] == 2
    a = AutoModelForCausalLM.from_pretrained(full / "policy").state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_stops_with_the_step_and_quantity(tmp_path):
    # Fault injection: the real policy's training-mode forward returns NaN logits from step 2 on (sampling
    # runs in eval mode and stays finite). Training must stop at step 2 naming the loss, before the step.
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.max_steps=5", "val.at_start=false",
                                       "callbacks.model_checkpoint.every_n_train_steps=1",
                                       "callbacks.model_checkpoint.monitor=null"])
    parts = build(cfg)
    module = parts["module"]
    module.configure_model()

    def poison(mod, args, kwargs, out):  # by step, not by call: a step may make several forward calls
        if mod.training and module.global_step >= 2:
            out.logits.mul_(float("nan"))
        return out

    module.policy.register_forward_hook(poison, with_kwargs=True)
    with pytest.raises(NonFiniteLossError, match=r"step 2: loss is nan"):
        parts["trainer"].fit(module, datamodule=parts["datamodule"])
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2


def test_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    pattern = r"step \d+: (loss is (nan|inf)|gradient norm is (nan|inf)|policy weights are non-finite|sampling failed)"
    with pytest.raises(NonFiniteLossError, match=pattern):
        _run(tmp_path, "algo.learning_rate=1e30", *varied(), "algo.max_grad_norm=null", "trainer.max_steps=20",
             "callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.model_checkpoint.monitor=null",
             "trainer.val_check_interval=100", "val.at_start=false")
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values() if v.is_floating_point())


@pytest.mark.parametrize(
    "override,key",
    [("algo.num_generations=1", "algo.num_generations"), ("algo.steps_per_generation=0", "algo.steps_per_generation"),
     ("algo.epsilon=-1", "algo.epsilon"), ("algo.loss_type=foo", "algo.loss_type")],
)
def test_invalid_values_name_the_key_before_any_model_is_built(tmp_path, override, key):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        run_training(cfg)
    assert not (tmp_path / "cache").exists()


def test_misspelt_key_is_rejected(tmp_path):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="epsilonn"):
        compose_train_cfg(tmp_path, ["algo.epsilonn=0.1"])


def test_a_run_without_learning_signal_says_so(tmp_path, caplog):
    # docs/guide/pitfalls.md #15: the random tiny model never answers correctly, so every group has zero variance.
    with caplog.at_level("WARNING", logger="grpolab.module"):
        _run(tmp_path, "trainer.max_steps=21", "val.at_start=false", "trainer.val_check_interval=100")
    assert any("zero reward variance for 20 steps" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("at_start", [True, False])
def test_val_accuracy_start_is_the_step0_measurement_or_null(tmp_path, at_start):
    summary, _ = _run(tmp_path, "trainer.max_steps=2", "trainer.val_check_interval=1", f"val.at_start={at_start}",
                      "save_policy=false")
    steps = [h["step"] for h in summary["val_history"]]
    assert steps == ([0] if at_start else []) + [1, 2]
    if at_start:
        assert summary["val_accuracy_start"] == summary["val_history"][0]["accuracy"]
    else:  # not the step-1 value under the name of a start
        assert summary["val_accuracy_start"] is None and summary["val_greedy_accuracy_start"] is None
    assert summary["val_accuracy_end"] == summary["val_history"][-1]["accuracy"]


def test_checkpoint_every_n_steps_with_a_monitor_warns_and_the_documented_keys_save_every_step(tmp_path, caplog):
    # Lightning (manual optimization) defers a monitored save to the next validation without a word
    every = ["callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.model_checkpoint.save_top_k=-1",
             "trainer.max_steps=2", "val.at_start=false", "save_policy=false"]
    with caplog.at_level("WARNING", logger="grpolab"):
        _run(tmp_path / "monitored", *every)
    assert "add callbacks.model_checkpoint.monitor=null" in caplog.text
    assert sorted(p.name for p in (tmp_path / "monitored" / "checkpoints").iterdir()) == ["last.ckpt"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="grpolab"):
        _run(tmp_path / "every", *every, "callbacks.model_checkpoint.monitor=null",
             "callbacks.model_checkpoint.filename='step{step}'")
    assert "monitor=null" not in caplog.text
    assert sorted(p.name for p in (tmp_path / "every" / "checkpoints").iterdir()) == ["last.ckpt", "step1.ckpt",
                                                                                      "step2.ckpt"]


def test_periodic_checkpoints_by_default_keep_the_newest_and_last_ckpt_beside_the_best(tmp_path):
    assert compose_train_cfg(tmp_path, []).callbacks.periodic_checkpoint.every_n_train_steps == 100  # the default
    _run(tmp_path, "callbacks.periodic_checkpoint.every_n_train_steps=2", "trainer.max_steps=6",
         "trainer.val_check_interval=3", "val.at_start=false", "save_policy=false")
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    best = [n for n in names if "-acc" in n]
    assert len(best) == 1 and sorted(set(names) - set(best)) == ["last.ckpt", "step4.ckpt", "step6.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6
