"""The memory plan's arithmetic: hand-computed byte counts, parameter counts checked against real models built
locally (PEFT's own count for LoRA), and the calibration against the measured 100M table (docs/results/real_shapes.md)."""

import pytest
import torch
from conftest import compose_train_cfg
from omegaconf import OmegaConf

from grpolab.app.plan_from_config import make_plan
from grpolab.config import GRPOConfig
from grpolab.lora import LoraAdapterConfig, apply_lora, count_parameters, validate_lora
from grpolab.plan.memory import (
    GIB,
    MIB,
    RUNTIME_BYTES,
    ModelShape,
    PlanInputs,
    format_plan,
    kv_cache_bytes,
    logits_bytes,
    lora_parameter_count,
    parameter_count,
    plan_memory,
)
from grpolab.plan.sampler_memory import GenerationShape
from grpolab.random_init import random_from_architecture
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine
from grpolab.rollout.engines.vllm import VLLMGenerationEngine

# h=8, i=16, 2 layers, 2 heads of 4 (1 kv head: kv_dim 4), 10 tokens.
SMALL = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             vocab_size=10, tie_word_embeddings=True, max_position_embeddings=64)
# One layer: q 64 + k 32 + v 32 + o 64 + gate/up/down 3 x 128 = 576 weights, 8 + 4 + 4 biases, 2 x 8 norms = 608.
SMALL_PARAMS = 10 * 8 + 2 * 608 + 8          # embeddings + layers + final norm (tied head) = 1304


def test_parameter_count_by_hand_and_against_transformers():
    shape = ModelShape.from_mapping(SMALL)
    assert parameter_count(shape) == SMALL_PARAMS == 1304
    assert parameter_count(ModelShape.from_mapping({**SMALL, "tie_word_embeddings": False})) == 1304 + 80
    for tied in (True, False):
        model = random_from_architecture({**SMALL, "tie_word_embeddings": tied}, seed=0, dtype=torch.float32)
        assert count_parameters(model)["num_params"] == parameter_count(
            ModelShape.from_mapping({**SMALL, "tie_word_embeddings": tied}))
    # The public sizes (the conf/model architecture nodes).
    assert parameter_count(ModelShape(896, 4864, 24, 14, 2, 151936, True)) == 494_032_768
    assert parameter_count(ModelShape(3584, 18944, 28, 28, 4, 152064, False)) == 7_615_616_512


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                     ["q_proj", "v_proj"], "all-linear"])
def test_lora_count_matches_peft(targets):
    shape = ModelShape.from_mapping(SMALL)
    # all seven: r x sum(in + out) = 2 x (16 + 12 + 12 + 16 + 24 + 24 + 24) = 256 per layer, 2 layers
    expected = {"q_proj,v_proj": 2 * 2 * (16 + 12)}.get(",".join(targets) if isinstance(targets, list) else "", 512)
    assert lora_parameter_count(shape, 2, targets) == expected
    model = apply_lora(random_from_architecture(SMALL, seed=0, dtype=torch.float32),
                       LoraAdapterConfig(r=2, target_modules=targets))
    assert count_parameters(model)["num_trainable_params"] == expected
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        lora_parameter_count(shape, 2, ["c_attn"])


def test_terms_by_hand_full_finetuning_fp32():
    shape = ModelShape.from_mapping(SMALL)
    # the sampler as rollout=hf_copy declares it: a copy of the policy, 3 sequences of 3 + 2 tokens decoded at once
    copy = HFSamplerCopyEngine.memory_needs({}, GenerationShape(model=shape, weight_bytes=4, policy_bytes=1304 * 4,
                                                                compute_bytes=4, train_rows=3, tokens=5))
    plan = plan_memory(PlanInputs(shape=shape, param_bytes=4, compute_bytes=4, beta=0.04, sampler=copy,
                                  fused_optimizer=False, completions_per_step=4, num_generations=2,
                                  prompt_length=3, completion_length=2, max_steps=10,
                                  steps_per_buffer=3, shared_prompt_forward=False))
    t = plan.terms
    assert t["weights"] == t["gradients"] == t["reference"] == t["sampler"] == 1304 * 4 == 5216
    assert t["optimizer"] == 2 * 5216 and t["optimizer_step"] == 5216  # foreach AdamW: one more gradient-size tensor
    # KV cache: 3 rows x 5 tokens x 2 layers x (k and v) x kv_dim 4 x 4 bytes = 960, decode logits 3 x 10 x 4 x 3
    assert kv_cache_bytes(shape, 3, 5, 4) == 960 and t["kv_cache"] == 960 + 360
    # logits: 4 rows x (2 + 1) x 10 x 12 bytes; layers: 20 tokens x (2 x (96 + 64 + 8) + 80) elements x 4 bytes
    assert logits_bytes(shape, 4, 2, 4) == 1440
    assert t["activations"] == 1440 + 20 * (2 * (12 * 8 + 4 * 16 + 2 * 4) + 10 * 8) * 4
    persistent = 5216 + 2 * 5216 + 5216 + 5216 + RUNTIME_BYTES
    assert plan.peak_bytes == persistent + 5216 + t["activations"]
    assert plan.tokens_per_step == 4 * 5 and (plan.sampler_refreshes, plan.weight_pushes) == (4, 4)
    assert "peak per process" in format_plan(plan)


def test_lora_bf16_mixed_and_no_reference():
    shape = ModelShape.from_mapping(SMALL)
    copy = HFSamplerCopyEngine.memory_needs({}, GenerationShape(model=shape, weight_bytes=2, compute_bytes=2,
                                                                policy_bytes=1304 * 2 + 512 * 4, async_generation=True))
    plan = plan_memory(PlanInputs(shape=shape, param_bytes=2, compute_bytes=2, autocast=True, adapter_bytes=4,
                                  lora_r=2, beta=0.04, async_generation=True, sampler=copy, max_steps=10))
    t = plan.terms
    assert t["weights"] == 1304 * 2 + 512 * 4 and t["reference"] == 0  # the reference is the base, adapters off
    assert t["gradients"] == 512 * 4 and t["optimizer"] == 2 * 512 * 4  # PEFT keeps adapters in float32
    assert t["sampler"] == t["weights"] and plan.weight_pushes == 9  # async: buffers 0 and 1 share a push
    assert plan.peak_bytes == sum(t[k] for k in plan.PERSISTENT) + t["gradients"] + t["activations"] + t["kv_cache"]


def test_fsdp_divides_and_ddp_adds_buckets():
    shape = ModelShape(896, 4864, 24, 14, 2, 151936, True)
    single = plan_memory(PlanInputs(shape=shape, param_bytes=2, beta=0.04))
    fsdp = plan_memory(PlanInputs(shape=shape, param_bytes=2, beta=0.04, strategy="fsdp", world_size=8))
    ddp = plan_memory(PlanInputs(shape=shape, param_bytes=2, beta=0.04, strategy="ddp", world_size=8))
    for key in ("weights", "gradients", "optimizer", "reference"):
        assert fsdp.terms[key] == -(-single.terms[key] // 8) and ddp.terms[key] == single.terms[key]
    assert ddp.terms["ddp_buckets"] == single.terms["gradients"] and fsdp.terms["ddp_buckets"] == 0
    # FSDP gathers the root unit (tied embeddings) and two layers: (151936 x 896 + 2 x 14,912,384) x 2 bytes
    assert fsdp.terms["fsdp_gathered"] == (151936 * 896 + 2 * 14_912_384) * 2


def test_vllm_share_on_gpu_and_cpu_space():
    shape = ModelShape.from_mapping(SMALL)
    # rollout=vllm's own declaration: its share of a known GPU, else a weight copy plus its KV-cache space
    on_gpu = GenerationShape(model=shape, on_gpu=True, device_bytes=80 * GIB)
    gpu = plan_memory(PlanInputs(shape=shape, sampler=VLLMGenerationEngine.memory_needs(
        {"gpu_memory_utilization": 0.3}, on_gpu)))
    assert gpu.terms["sampler"] == int(0.3 * 80 * GIB) and gpu.terms["kv_cache"] == 0
    cpu = plan_memory(PlanInputs(shape=shape, sampler=VLLMGenerationEngine.memory_needs(
        {"kv_cache_memory_bytes": 2 * GIB}, GenerationShape(model=shape))))
    assert cpu.terms["sampler"] == 1304 * 4 + 2 * GIB


def test_bad_architecture_names_the_key():
    with pytest.raises(ValueError, match="model.architecture.hidden_size"):
        ModelShape.from_mapping({**SMALL, "hidden_size": 0})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelShape.from_mapping({**SMALL, "num_key_value_heads": 3, "num_attention_heads": 4})


# docs/results/real_shapes.md, "Peak memory of one GRPO step at 100M parameters": python benchmarks/memory.py, fp32 CPU, peak RSS in MiB of the whole process.
README_PEAK_MIB = {(None, 0.0, False): 6357, (None, 0.0, True): 5922, (None, 0.04, False): 6738,
                   (None, 0.04, True): 6372, (16, 0.0, False): 6217, (16, 0.0, True): 5550,
                   (16, 0.04, False): 6051, (16, 0.04, True): 5586}


@pytest.mark.parametrize("case", list(README_PEAK_MIB))
def test_plan_against_the_readme_measurements(tmp_path, shared_data, case):
    import importlib.util

    from conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_memory", REPO_ROOT / "benchmarks" / "memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lora_r, beta, ckpt = case
    overrides = bench.overrides(bench.FULL, lora_r, beta, ckpt, "cpu", "32-true", 2, tmp_path)
    # 115 tokens: the mean longest prompt of two GSM8K prompts (chat template, Qwen2.5 tokenizer; max 232)
    cfg = compose_train_cfg(tmp_path, [*overrides, "algo.max_prompt_length=115"])
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    plan, _, _ = make_plan(cfg, algo, validate_lora(cfg.model.lora))
    ratio = plan.peak_bytes / (README_PEAK_MIB[case] * MIB)
    assert 0.9 < ratio < 1.1, (case, ratio, plan.terms)


def test_a_sampler_server_is_not_planned_in_the_training_process(tmp_path):
    # rollout=vllm_server: the server's weights and KV cache live on its own devices; only the last push kept
    # for checkpoints (async) is the trainer's
    for extra, kept in (([], False), (["rollout.async_generation=true"], True)):
        cfg = compose_train_cfg(tmp_path, ["rollout=vllm_server", "algo=grpo_offpolicy",
                                           "rollout.server.url=http://10.0.0.2:8000", *extra])
        algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
        plan, _, _ = make_plan(cfg, algo, validate_lora(cfg.model.get("lora"), algo.ref_refresh_every))
        weights = plan.num_params * 4  # float32 tiny model
        assert plan.terms["sampler"] == (weights if kept else 0)
        assert any("sampler server" in n for n in plan.notes)
