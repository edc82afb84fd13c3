"""Checkpoints leave the frozen reference model and a LoRA base out (grpolab.checkpoint.frozen_weights), rebuild them at
resume after checking their hash, and refuse a resume whose config builds other frozen weights."""

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.app.run import run_training
from grpolab.checkpoint import frozen_weights

CKPT = ["callbacks.model_checkpoint.every_n_train_steps=2", "callbacks.model_checkpoint.monitor=null",
        "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'",
        "trainer.val_check_interval=100", "val.at_start=false", "trainer.max_steps=4"]
FULL = ["algo=grpo_offpolicy", "algo.steps_per_generation=3", "algo.beta=0.04"]
LORA = ["model.lora.r=4", "algo.beta=0.04", "algo.learning_rate=1e-2"]


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter under two keys
        self.adapter = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.ones(3))


def _frozen_model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = _Tied()
    m.embed.weight.requires_grad_(False)
    return m


def test_frozen_keys_are_the_parameters_without_gradient_under_every_tied_name():
    state = _frozen_model().state_dict(keep_vars=True)
    assert frozen_weights.frozen_keys(state) == ["embed.weight", "head.weight"]  # not the buffer, not the adapter


def test_fingerprint_sees_one_changed_element_and_restore_puts_the_tensors_back():
    model = _frozen_model()
    state = model.state_dict(keep_vars=True)
    keys = frozen_weights.frozen_keys(state)
    record = frozen_weights.describe(state, keys)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    frozen_weights.strip(saved, record)
    assert sorted(saved) == ["adapter.bias", "adapter.weight", "scale"]

    rebuilt = _frozen_model()  # the same construction: the same bytes
    n = frozen_weights.restore(saved, rebuilt.state_dict(keep_vars=True), record, "x.ckpt")
    assert n == 2 and torch.equal(saved["head.weight"], model.embed.weight)
    rebuilt.load_state_dict(saved, strict=True)

    other = _frozen_model()
    with torch.no_grad():
        other.embed.weight[4, 2] += 1e-6
    with pytest.raises(frozen_weights.FrozenWeightsMismatch, match=r"x\.ckpt: the frozen 'embed' weights"):
        frozen_weights.restore({}, other.state_dict(keep_vars=True), record, "x.ckpt")


def _run(path, *overrides):
    summary = run_training(compose_train_cfg(path, [*FAST_OVERRIDES, *CKPT, *overrides]))
    return summary, pd.read_csv(path / "metrics.csv")


@pytest.mark.parametrize("setting", [FULL, LORA], ids=["full_reference", "lora_base"])
def test_checkpoint_leaves_frozen_weights_out_and_resume_is_exact(tmp_path, setting):
    _, full = _run(tmp_path / "full", *setting)
    ckpt_path = tmp_path / "full" / "checkpoints" / "step2.ckpt"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    record = ckpt["grpolab"][frozen_weights.RECORD_KEY]
    kept = ckpt["state_dict"]
    assert record["keys"] and not set(record["keys"]) & set(kept)
    if setting is FULL:  # the whole reference is left out, the whole policy kept
        assert {k.split(".")[0] for k in record["keys"]} == {"reference"}
        assert any(k.startswith("policy.") for k in kept)
    else:  # only the adapters (and buffers) are kept
        assert all(".lora_" in k for k, v in kept.items() if v.dtype.is_floating_point and v.dim() == 2)

    summary, resumed = _run(tmp_path / "resumed", *setting, f"ckpt_path={ckpt_path}")
    assert summary["steps"] == 4
    cols = ["train/loss", "train/reward", "train/kl"]
    tail = full[full["step"] > 2].dropna(subset=["train/loss"])[cols].reset_index(drop=True)
    got = resumed[resumed["step"] > 2].dropna(subset=["train/loss"])[cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(tail, got)


def test_resume_with_a_model_that_builds_another_reference_is_refused(tmp_path):
    _run(tmp_path / "full", *FULL)
    ckpt_path = tmp_path / "full" / "checkpoints" / "step2.ckpt"
    with pytest.raises(frozen_weights.FrozenWeightsMismatch, match=r"step2\.ckpt: the frozen 'reference' weights"):
        _run(tmp_path / "other", *FULL, "model.seed=5", f"ckpt_path={ckpt_path}")


def test_a_reference_that_ref_refresh_every_moves_is_kept(tmp_path):
    _run(tmp_path / "full", *FULL, "algo.ref_refresh_every=1")
    ckpt = torch.load(tmp_path / "full" / "checkpoints" / "step2.ckpt", map_location="cpu", weights_only=False)
    assert any(k.startswith("reference.") for k in ckpt["state_dict"])
    assert not ckpt["grpolab"].get(frozen_weights.RECORD_KEY)


def test_eval_of_a_lora_checkpoint_rebuilds_the_base_and_matches_the_exported_policy(tmp_path):
    from grpolab.evaluation.evaluate import evaluate

    def compose_eval_cfg(out, overrides):
        return compose_train_cfg(out, overrides, config_name="eval")

    _run(tmp_path / "run", *LORA)
    model_data = [o for o in FAST_OVERRIDES if o.startswith(("model.", "data."))]
    common = [*model_data, "eval.progress_bar=false", "eval.num_samples=2", "eval.max_prompts=8"]
    by_ckpt = evaluate(compose_eval_cfg(tmp_path / "e1", [*common, "model.lora.r=4",
                                                          f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}"]))
    by_export = evaluate(compose_eval_cfg(tmp_path / "e2", [*common, f"model.path={tmp_path / 'run' / 'policy'}"]))
    assert by_ckpt["accuracy"] == by_export["accuracy"] and by_ckpt["mean_length"] == by_export["mean_length"]


def test_a_resume_that_turns_on_ref_refresh_every_keeps_the_moving_reference(tmp_path):
    """Saved without ``ref_refresh_every`` (the reference left out), resumed with it: the reference now moves, so
    the next checkpoints keep it, and resuming from one of them equals the uninterrupted run (the initial reference,
    rebuilt from the config, is not put back)."""
    steps6 = [o for o in CKPT if not o.startswith("trainer.max_steps")] + ["trainer.max_steps=6"]
    # rewards that vary within every group by design (tests/certain_reward.py), not by what a warm start happens to
    # sample on this processor: the policy moves at every step, so the KL to a refreshed reference moves too
    moving_policy = [*FAST_OVERRIDES, *varied(), "algo.learning_rate=1e-2"]

    def run(path, *overrides, max_steps=steps6):
        summary = run_training(compose_train_cfg(path, [*moving_policy, *max_steps, *FULL, *overrides]))
        return summary, pd.read_csv(path / "metrics.csv")

    run(tmp_path / "frozen", max_steps=CKPT)
    moving = ["algo.ref_refresh_every=3"]
    _, full = run(tmp_path / "moving", *moving, f"ckpt_path={tmp_path / 'frozen' / 'checkpoints' / 'step2.ckpt'}")
    ckpt4 = tmp_path / "moving" / "checkpoints" / "step4.ckpt"
    saved = torch.load(ckpt4, map_location="cpu", weights_only=True)
    assert any(k.startswith("reference.") for k in saved["state_dict"])
    assert not any(k.startswith("reference.") for k in saved["grpolab"].get(frozen_weights.RECORD_KEY, {}).get("keys", []))
    _, again = run(tmp_path / "again", *moving, f"ckpt_path={ckpt4}")
    cols = ["train/loss", "train/kl"]
    tail = full[full["step"] >= 4].dropna(subset=["train/loss"])[cols].reset_index(drop=True)
    got = again[again["step"] >= 4].dropna(subset=["train/loss"])[cols].reset_index(drop=True)
    assert len(got) == 2 and (got["train/kl"] > 0).all()
    pd.testing.assert_frame_equal(tail, got)

def _tail(frame, after: int, cols=("train/loss", "train/kl")):
    rows = frame[frame["step"] >= after].dropna(subset=["train/loss"])
    return rows[list(cols)].reset_index(drop=True)


def test_a_resume_that_turns_off_ref_refresh_every_keeps_the_moved_reference(tmp_path):
    """A run with ``algo.ref_refresh_every`` saves its moved reference; resumed without it (then frozen, so left out
    of checkpoints by default), the moved reference must stay in the next checkpoints: resuming again from one of
    them equals the first resumed run (before, the initial reference was rebuilt and the resume refused as another
    model). The opposite direction (turning it on) is test_a_resume_that_turns_on_ref_refresh_every_... ."""
    moving = [*FULL, *varied(), "algo.learning_rate=1e-2"]  # reward variance: the policy moves
    _run(tmp_path / "a", *moving, "algo.ref_refresh_every=1")  # the reference moves at steps 1-3
    _, b = _run(tmp_path / "b", *moving, "trainer.max_steps=8",
                f"ckpt_path={tmp_path / 'a' / 'checkpoints' / 'step4.ckpt'}")
    step6 = tmp_path / "b" / "checkpoints" / "step6.ckpt"
    assert any(k.startswith("reference.") for k in torch.load(step6, weights_only=True)["state_dict"])
    _, c = _run(tmp_path / "c", *moving, "trainer.max_steps=8", f"ckpt_path={step6}")
    assert len(_tail(c, 6)) == 2 and _tail(c, 6)["train/kl"].gt(0).all()
    pd.testing.assert_frame_equal(_tail(b, 6), _tail(c, 6))
