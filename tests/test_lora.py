"""LoRA through PEFT (model.lora.*): trainable share, reference = base with adapters off, merged export,
exact resume, and the bad-input errors; plus the trainer.devices check."""

import json

import pandas as pd
import pytest
import torch
from certain_reward import varied
from conftest import FAST_OVERRIDES, compose_train_cfg
from peft import PeftModel
from transformers import AutoModelForCausalLM

from grpolab.app.run import build, run_training
from grpolab.forward.logprob_pass import batched_log_probs
from grpolab.lora import AdapterDisabledReference
from grpolab.models import build_char_tokenizer, random_qwen2

LORA = ["model.lora.r=4", "algo.beta=0.04", *varied(), "algo.learning_rate=1e-2"]


def _run(tmp_path, *overrides):
    summary = run_training(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *overrides]))
    return summary, pd.read_csv(tmp_path / "metrics.csv")


def test_lora_trains_few_parameters_and_exports_a_merged_policy(tmp_path):
    summary, metrics = _run(tmp_path, *LORA, "trainer.max_steps=3", "trainer.val_check_interval=3")
    assert 0 < summary["num_trainable_params"] < summary["num_params"] / 2
    assert json.loads((tmp_path / "summary.json").read_text())["world_size"] == 1
    kl = metrics.dropna(subset=["train/kl"])["train/kl"].tolist()
    assert kl[0] == 0.0 and kl[-1] > 0  # LoRA starts at B = 0 (policy == reference), then moves away
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    base = random_qwen2(build_char_tokenizer(), _arch(), seed=0, dtype=torch.float32)
    expected = PeftModel.from_pretrained(base, tmp_path / "policy" / "adapter").merge_and_unload().state_dict()
    got = merged.state_dict()
    assert expected.keys() == got.keys() and all(torch.allclose(got[k], expected[k]) for k in got)
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"],
                           random_qwen2(build_char_tokenizer(), _arch(), 0, torch.float32).state_dict()[
                               "model.layers.0.self_attn.q_proj.weight"])


def _arch():
    return dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=64, max_position_embeddings=64)


def test_reference_is_the_base_with_adapters_disabled_and_no_copy(tmp_path):
    parts = build(compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *LORA]))
    module = parts["module"]
    module.configure_model()
    assert isinstance(module.reference, AdapterDisabledReference)
    assert len(module.reference.state_dict()) == 0  # holds no weights of its own
    with torch.no_grad():  # move the adapters so that policy and base differ
        for n, p in module.policy.named_parameters():
            if "lora_B" in n:
                p.normal_()
    g = torch.Generator().manual_seed(0)
    batch = {"prompt_ids": torch.randint(3, 20, (2, 4), generator=g), "prompt_mask": torch.ones(2, 4),
             "completion_ids": torch.randint(3, 20, (2, 3), generator=g), "completion_mask": torch.ones(2, 3)}
    ref = batched_log_probs(module.reference, batch, 1.0, None)
    pol = batched_log_probs(module.policy, batch, 1.0, None)
    base = random_qwen2(build_char_tokenizer(), _arch(), seed=0, dtype=torch.float32)
    torch.testing.assert_close(ref, batched_log_probs(base, batch, 1.0, None))
    assert not torch.allclose(ref, pol)
    assert module.policy.training  # the reference forward leaves the policy's mode alone


def test_exact_resume_with_lora(tmp_path):
    common = [*LORA, "algo=grpo_offpolicy", "algo.steps_per_generation=3", "trainer.val_check_interval=100",
              "val.at_start=false", "callbacks.model_checkpoint.every_n_train_steps=4",
              "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
              "callbacks.model_checkpoint.filename='step{step}'", "trainer.max_steps=6"]
    _run(tmp_path / "full", *common)
    ckpt = tmp_path / "full" / "checkpoints" / "step4.ckpt"
    summary, _ = _run(tmp_path / "resumed", *common, f"ckpt_path={ckpt}")
    assert summary["steps"] == 6
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "policy").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "policy").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_target_modules_naming_no_module_lists_the_names(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "model.lora.r=4", "model.lora.target_modules=[q_proj,qproj]"])
    module = build(cfg)["module"]
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules \['qproj'\].*'down_proj'.*'q_proj'"):
        module.configure_model()


@pytest.mark.parametrize("override,key", [("model.lora.r=0", "model.lora.r"),
                                          ("model.lora.dropout=1.5", "model.lora.dropout"),
                                          ("trainer.devices=4096", "trainer.devices")])
def test_bad_scale_settings_fail_before_any_model_is_built(tmp_path, override, key):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer=ddp", override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        run_training(cfg)
    assert not (tmp_path / "cache").exists()


def test_lora_with_reference_refresh_is_rejected(tmp_path):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *LORA, "algo.ref_refresh_every=10"])
    with pytest.raises(ValueError, match=r"algo\.ref_refresh_every"):
        run_training(cfg)


def test_merged_state_dict_is_merge_and_unload_bit_for_bit_and_leaves_the_policy_alone():
    # What a sampler engine (rollout=vllm) loads: base checkpoint names, LoRA folded in, no merge in place.
    import copy

    from grpolab.lora import LoraAdapterConfig, apply_lora, merged_state_dict

    base = random_qwen2(build_char_tokenizer(), _arch(), seed=0, dtype=torch.float32)
    names = set(base.state_dict())
    policy = apply_lora(base, LoraAdapterConfig(r=4, alpha=8))
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    got = merged_state_dict(policy)
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(got) == set(expected) == names
    for k in got:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0, msg=k)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trainer's weights never move
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], after[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    plain = random_qwen2(build_char_tokenizer(), _arch(), seed=0, dtype=torch.float32)
    assert merged_state_dict(plain).keys() == plain.state_dict().keys()
