"""Engines plan their own memory (GenerationEngine.memory_needs): an engine defined here, outside src/, is planned by
`+plan_only=true` from its own declaration with no edit to the plan; each shipped engine declares what the plan
counted for it before; the ownership contract (validation_engine) is enforced when a class is defined; the start-up
log-prob check reads an engine through a typed protocol."""

from __future__ import annotations

import os
import sys

import forkrun
import pytest
import torch
from conftest import REPO_ROOT, compose_train_cfg
from omegaconf import OmegaConf

from grpolab.app.plan_from_config import make_plan, model_shape
from grpolab.app.run import build
from grpolab.config import GRPOConfig
from grpolab.errors import ConfigError
from grpolab.lora import validate_lora
from grpolab.plan.memory import GIB, MIB, parameter_count
from grpolab.plan.sampler_memory import GenerationShape, SamplerMemory
from grpolab.rollout.engines.base import Generation, GenerationEngine, SamplingParams
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine
from grpolab.rollout.engines.vllm import VLLMGenerationEngine
from grpolab.rollout.engines.vllm_check import CheckedEngine, check_push
from grpolab.rollout.engines.vllm_server.engine import VLLMServerEngine


class ReservingEngine(HFSamplerCopyEngine):
    """A sampler unknown to grpolab: two copies of the merged weights (say, a draft and a target) plus a cache of
    ``cache_mib`` reserved when it starts; its own knob shrinks that cache."""

    def __init__(self, stop_token_ids: list[int], pad_token_id: int, cache_mib: int = 64) -> None:
        super().__init__(stop_token_ids, pad_token_id)
        self.cache_mib = cache_mib

    @classmethod
    def memory_needs(cls, args, shape: GenerationShape) -> SamplerMemory:
        return SamplerMemory(weights_bytes=2 * shape.weight_copy_bytes, cache_bytes=int(args["cache_mib"]) * MIB,
                             cache_reserved=True, generation_rows=shape.train_rows,
                             knobs=("rollout.cache_mib=1 (the reserving engine's cache)",),
                             notes=("reserving engine: two weight copies and its own cache",))


class PlainEngine(GenerationEngine):
    """An engine that declares nothing about its memory (the interface's default plans it)."""

    def __init__(self, stop_token_ids: list[int], pad_token_id: int) -> None:
        self.stop_token_ids, self.pad_token_id = stop_token_ids, pad_token_id

    def generate(self, model, prompts, params) -> Generation:
        return HFGenerationEngine(self.stop_token_ids, self.pad_token_id).generate(model, prompts, params)


def _conf(tmp_path, name: str, cls: type, extra: str = "") -> list[str]:
    conf = tmp_path / "conf" / "rollout"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / f"{name}.yaml").write_text(f"defaults:\n  - base\n  - _self_\n_target_: {__name__}.{cls.__name__}\n{extra}")
    return [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"rollout={name}"]


def _plan(tmp_path, overrides):
    cfg = compose_train_cfg(tmp_path, overrides)
    algo = GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True))
    plan, budget, _ = make_plan(cfg, algo, validate_lora(cfg.model.get("lora"), algo.ref_refresh_every))
    return cfg, plan, budget


def test_a_new_engine_plans_its_own_memory_through_plan_only(tmp_path):
    # the engine lives in this test file and a yaml in a temporary folder: nothing in src/ names it
    rollout = _conf(tmp_path, "reserving", ReservingEngine, "cache_mib: 64\n")
    cfg, plan, _ = _plan(tmp_path / "a", [*rollout, "algo=grpo_offpolicy"])
    shape, _ = model_shape(cfg.model)
    weights = parameter_count(shape) * 4  # the tiny model in float32
    assert plan.terms["sampler"] == 2 * weights + 64 * MIB
    assert "reserving engine: two weight copies and its own cache" in plan.notes
    # a device just too small for the 64 MiB cache: the verdict re-plans the engine's own knob and finds the fit
    device = plan.peak_bytes - 32 * MIB
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "tests"), str(REPO_ROOT / "src")])}
    proc = forkrun.run([sys.executable, "src/train.py", *rollout, "algo=grpo_offpolicy", "+plan_only=true",
                        f"plan.device_memory={device}", f"hydra.run.dir={run}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"{'sampler':<38} {plan.terms['sampler'] / GIB:>9.3f}" in out
    assert "note: reserving engine: two weight copies and its own cache" in out
    assert "verdict: does not fit" in out and "fits with, each alone: rollout.cache_mib=1" in out
    assert not run.exists()  # plan only: no run folder left behind


def test_an_engine_that_declares_nothing_gets_the_default_plan(tmp_path):
    _, plan, _ = _plan(tmp_path, _conf(tmp_path, "plain", PlainEngine))
    _, in_place, _ = _plan(tmp_path / "hf", ["rollout=hf"])
    assert plan.terms["sampler"] == 0 and plan.terms["kv_cache"] == in_place.terms["kv_cache"]
    assert any("PlainEngine declares no memory_needs" in n for n in plan.notes)


def test_the_shipped_engines_declare_what_the_plan_counted(tmp_path):
    common = ["algo=grpo_offpolicy", "model=qwen0.5b", "model.dtype=float32", "model.gradient_checkpointing=false"]
    _, hf, _ = _plan(tmp_path, [*common, "rollout=hf"])
    _, copy, _ = _plan(tmp_path, [*common, "rollout=hf_copy"])
    policy = hf.num_params * 4
    assert hf.terms["sampler"] == 0 and copy.terms["sampler"] == policy and copy.terms["kv_cache"] == hf.terms["kv_cache"]
    # generation_batch_size caps the decode: 8 sequences of (256 + 6) tokens, 24 layers x k and v x 2 kv heads of 64
    _, capped, _ = _plan(tmp_path, [*common, "rollout=hf", "rollout.generation_batch_size=8", "val.batch_size=1"])
    assert capped.terms["kv_cache"] == 8 * 262 * 24 * 2 * 128 * 4 + 8 * 151936 * 4 * 3
    # in-process vLLM: its share of a named GPU, else weights + its KV-cache space (+ the kept push when async)
    _, gpu, _ = _plan(tmp_path, [*common, "rollout=vllm", "trainer=gpu", "trainer.precision=32-true",
                                 "plan.device_memory=80GiB"])
    assert gpu.terms["sampler"] == int(0.3 * 80 * GIB)
    _, cpu, _ = _plan(tmp_path, [*common, "rollout=vllm", "rollout.kv_cache_memory_bytes=1048576",
                                 "rollout.async_generation=true"])
    assert cpu.terms["sampler"] == 2 * policy + (1 << 20)
    # a server on its own devices: nothing but the push kept for checkpoints (async)
    server = [*common, "rollout=vllm_server", "rollout.server.url=http://10.0.0.2:8000"]
    _, sync, _ = _plan(tmp_path, server)
    _, kept, _ = _plan(tmp_path, [*server, "rollout.async_generation=true"])
    assert sync.terms["sampler"] == 0 and kept.terms["sampler"] == policy
    for plan in (hf, copy, gpu, cpu, sync):  # validation samples in place on the live policy
        assert plan.terms["kv_cache"] > 0


def test_an_engine_that_owns_weights_must_name_its_validation_engine():
    with pytest.raises(TypeError, match=r"<locals>\.StaleValidator owns its weights .*\['validation_engine'\]"):
        class StaleValidator(GenerationEngine):
            owns_weights = True

            def generate(self, model, prompts, params):
                raise NotImplementedError

            def sync_weights(self, model, version):
                pass

            def sampler_state_dict(self):
                return {}

            def load_sampler_state_dict(self, state, like):
                pass
    assert isinstance(HFSamplerCopyEngine([0], 0).validation_engine(), HFGenerationEngine)


def test_sleep_and_wake_are_the_vllm_engines_own():
    # only the in-process vLLM engine calls them (around its own generate and push): not a contract member
    assert not hasattr(GenerationEngine, "sleep") and not hasattr(GenerationEngine, "wake")
    assert callable(VLLMGenerationEngine.sleep) and callable(VLLMGenerationEngine.wake)


def test_each_engine_checks_its_own_keys_before_any_model(tmp_path):
    with pytest.raises(ConfigError, match="rollout.cache_implementation must be one of dynamic, preallocated"):
        HFGenerationEngine.check_config({"cache_implementation": "static"})
    with pytest.raises(ConfigError, match="rollout.generation_batch_size"):
        HFSamplerCopyEngine.check_config({"generation_batch_size": 0})
    VLLMGenerationEngine.check_config({"cache_implementation": "static"})  # not an argument of vLLM's: not read
    # the in-process vLLM engine's knobs, refused by preflight (before vLLM is even looked for, and before any model)
    for override, key in (("rollout.gpu_memory_utilization=1.5", "gpu_memory_utilization"),
                          ("rollout.max_num_seqs=0", "max_num_seqs"), ("rollout.enable_sleep_mode=maybe", "enable_sleep")):
        with pytest.raises(ConfigError, match=f"rollout.{key}"):
            build(compose_train_cfg(tmp_path, ["rollout=vllm", override]))
    assert not (tmp_path / "cache").exists()


class ProbedCopyEngine(HFSamplerCopyEngine):
    """The start-up check's protocol on a Hugging Face copy: its own log-probs of what it samples from its copy."""

    sync_check_tolerance = 1e-4
    probe_name = "the test's sampler copy"

    def __init__(self, stop_token_ids, pad_token_id, max_len: int) -> None:
        super().__init__(stop_token_ids, pad_token_id)
        self.sync_check: dict[str, float] = {}
        self.max_len = max_len

    def probe(self, prompts, temperature, max_tokens):
        torch.manual_seed(0)
        gen = self.generate(None, prompts, SamplingParams(temperature=temperature, max_new_tokens=max_tokens,
                                                          return_log_probs=True))
        return [(gen.completion_ids[i].tolist(), gen.sampler_logp[i].tolist()) for i in range(len(prompts))]


def test_the_push_check_reads_a_typed_engine(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    policy = tiny_spec.load_policy()
    engine = ProbedCopyEngine([10**6], tok.pad_token_id, max_len=13)  # an id never sampled: every token counts
    assert isinstance(engine, CheckedEngine)
    assert isinstance(VLLMServerEngine([0], 0, server={"url": "http://127.0.0.1:9"}), CheckedEngine)
    engine.sync_weights(policy, 0)
    result = check_push(engine, policy)
    assert result["max_abs_logp_difference"] < 1e-5 and engine.sync_check == result
    with torch.no_grad():  # the policy moves on; the copy was not pushed: the check must catch the stale sampler
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(RuntimeError, match="the test's sampler copy.*stale"):
        check_push(engine, policy)
    assert engine.sync_check["mean_abs_logp_difference"] > 1e-4  # stored also when the check fails
