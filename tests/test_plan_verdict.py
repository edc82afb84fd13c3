"""The plan's verdict against a device the user names (plan.device_memory), the settings that would each make a run
fit, gradient checkpointing planned (and measured) as Hugging Face's checkpointing keeps memory, and the run folders a
plan-only run or a refused run no longer leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import compose_train_cfg
from omegaconf import OmegaConf

from grpolab.app.plan_from_config import fits_with, make_plan, print_plan, refusal_message
from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.lora import validate_lora
from grpolab.plan.memory import GIB, MIB, ModelShape, layer_activation_bytes
from grpolab.plan.verdict import parse_size

# The realistic 7B config of docs/guide/scale-out.md's plan example: GSM8K prompts (<= 256 tokens with the chat template),
# 512-token completions, one GPU.
QWEN7B_GSM8K = ["model=qwen7b", "data=gsm8k", "verifier=gsm8k", "trainer=gpu", "algo.max_prompt_length=256",
                "algo.max_completion_length=512"]


def _plan(tmp_path, overrides):
    cfg = compose_train_cfg(tmp_path, overrides)
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    plan, budget, source = make_plan(cfg, algo, validate_lora(cfg.model.get("lora"), algo.ref_refresh_every))
    return cfg, plan, budget, source


@pytest.mark.parametrize("value,expected", [("80GiB", 80 * GIB), ("81920MiB", 80 * GIB), ("80 GB", 80 * 10**9),
                                            ("1.5tib", int(1.5 * 2**40)), (85899345920, 80 * GIB), (None, None)])
def test_device_memory_sizes(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize("bad", ["80G", "abc", "-3", 0, True, "80 GiBs"])
def test_a_bad_device_memory_names_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match="plan.device_memory must be a device size such as 80GiB"):
        _plan(tmp_path, [*QWEN7B_GSM8K, f"plan.device_memory={bad}"])


def test_the_plan_says_fits_or_does_not_fit_on_a_named_device(tmp_path, capsys):
    cfg, plan, budget, source = _plan(tmp_path, [*QWEN7B_GSM8K, "plan.device_memory=80GiB"])
    assert (budget, source) == (80 * GIB, "plan.device_memory")
    print_plan(cfg)
    out = capsys.readouterr().out
    # 64 completions in one micro-batch: the activations alone are larger than the device
    assert "verdict: does not fit" in out and f"{plan.peak_bytes / GIB:.1f} GiB per process" in out
    line = next(x for x in out.splitlines() if "fits with, each alone" in x)
    assert "algo.micro_batch_size=16" in line  # the largest micro-batch that fits, re-planned
    cfg, _, _, _ = _plan(tmp_path, [*QWEN7B_GSM8K, "plan.device_memory=80GiB", "algo.micro_batch_size=4"])
    print_plan(cfg)
    assert "verdict: fits: 62.6 GiB per process of 80.0 GiB (plan.device_memory), 17.4 GiB to spare" in \
        capsys.readouterr().out
    cfg, _, budget, _ = _plan(tmp_path, [*QWEN7B_GSM8K])  # no GPU here and none named: no verdict, and how to get one
    if budget is None:
        print_plan(cfg)
        out = capsys.readouterr().out
        assert "verdict: none: the memory this run will have is unknown" in out and "plan.device_memory=80GiB" in out


def test_each_setting_that_would_make_it_fit_is_found_by_replanning(tmp_path):
    overrides = [*QWEN7B_GSM8K, "trainer=ddp_gpu", "plan.device_memory=80GiB", "algo.micro_batch_size=4",
                 "model.gradient_checkpointing=false"]
    cfg, plan, budget, source = _plan(tmp_path, overrides)
    assert plan.peak_bytes > budget
    found = fits_with(cfg, plan)
    names = [f.rsplit(" (", 1)[0] for f in found]
    assert names == ["model.lora.r=16", "model.gradient_checkpointing=true", "algo.micro_batch_size=1",
                     "trainer=fsdp trainer.accelerator=gpu trainer.precision=bf16-mixed trainer.devices=8"]
    for setting, text in zip(names, found):  # each one, applied alone, does fit: the peak it reports is the plan's
        key_values = [s for s in setting.split() if "=" in s and not s.startswith("trainer=")]
        extra = ["trainer=fsdp", "trainer.accelerator=gpu", "trainer.precision=bf16-mixed"] if "fsdp" in setting else []
        _, again, _, _ = _plan(tmp_path, [*overrides, *extra, *key_values])
        assert again.peak_bytes <= 80 * GIB and f"({again.peak_bytes / GIB:.1f} GiB)" in text
    message = refusal_message(plan, budget, source, cfg)
    assert "It fits with, each alone: model.lora.r=16" in message and "plan.check=false" in message


def test_gradient_checkpointing_keeps_each_layers_input_and_one_layer(tmp_path):
    shape = ModelShape(256, 512, 8, 4, 2, 64, True)
    tokens, per_layer, backward = 8 * 512, 12 * 256 + 4 * 512 + 2 * 128, 10 * 256
    # float32 weights under bf16 autocast: the residual stream (the kept inputs) stays float32, a layer at 3 bytes
    kept = layer_activation_bytes(shape, 8, 0, 512, 2, True, hidden_bytes=4)
    assert kept == 8 * tokens * 256 * 4 + tokens * (per_layer + backward) * 3
    assert layer_activation_bytes(shape, 8, 0, 512, 4, False) == (8 * tokens * per_layer + tokens * backward) * 4
    # through the config: the 7B plan with and without checkpointing differ, and the plan says which one it made
    _, on, _, _ = _plan(tmp_path, [*QWEN7B_GSM8K, "model.gradient_checkpointing=true"])
    _, off, _, _ = _plan(tmp_path, [*QWEN7B_GSM8K, "model.gradient_checkpointing=false"])
    assert on.terms["activations"] < off.terms["activations"] / 4  # 81.7 against 391.5 GiB (64 rows at once)
    assert any(n.startswith("model.gradient_checkpointing=true") for n in on.notes)
    assert not any(n.startswith("model.gradient_checkpointing") for n in off.notes)


# A random Qwen2 trained one step, its checkpointed backward's transient memory measured in a fresh process (the
# kernel's high-water mark above the resident set before the step; freed tensors returned at once, as
# malloc_mmap_threshold=auto does for real models).
MEASURE = """
import json, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
torch.manual_seed(0)
config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=int(sys.argv[1]), num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=1024, attn_implementation="sdpa")
model = Qwen2ForCausalLM(config).float().train()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as grpolab.models
ids = torch.randint(0, 64, (4, 512))
def step():
    model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
step()  # the gradients exist from now on
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
step()
print(json.dumps({"transient": status("VmHWM") - before}))
"""


def _measured(layers: int) -> int:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(layers)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["transient"]


def test_checkpointing_plan_against_a_measured_backward():
    small, deep = _measured(2), _measured(6)
    tokens = 4 * 512
    # each further layer keeps its input only: tokens x h float32 (measured 2.1 MiB a layer here)
    per_layer = (deep - small) / 4
    assert abs(per_layer - tokens * 256 * 4) < 0.2 * tokens * 256 * 4, per_layer / MIB
    for layers, measured in ((2, small), (6, deep)):
        planned = layer_activation_bytes(ModelShape(256, 512, layers, 4, 2, 64, True), 4, 0, 512, 4, True)
        # one recomputed layer (and its backward) on top of the inputs: the plan is 1.36-1.42x the measurement,
        # conservative; the two layers planned before were 2.3x
        assert 1.0 <= planned / measured < 1.8, (layers, planned / MIB, measured / MIB)
