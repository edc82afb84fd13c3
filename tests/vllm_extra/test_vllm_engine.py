"""rollout=vllm on this CPU (needs the vllm extra; skipped in the main environment, run by .ci/run in a second one).

One engine is built per module (about 2 s in process) and shared: building a vLLM engine per test would cost
more than the tests.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, TINY_ARCH, compose_train_cfg

pytest.importorskip("vllm")

from grpolab.app.run import build, summarize  # noqa: E402
from grpolab.forward.logprob_pass import batched_log_probs  # noqa: E402
from grpolab.models import TinyCharModel  # noqa: E402
from grpolab.rollout.engines.base import SamplingParams  # noqa: E402
from grpolab.rollout.engines.vllm import VLLMGenerationEngine  # noqa: E402
from grpolab.rollout.engines.vllm_check import check_push  # noqa: E402

# vLLM's CPU attention kernels reject a head size of 16 (TINY_ARCH's 32 / 2 heads): one head of 32.
VLLM_ARCH = {**TINY_ARCH, "num_attention_heads": 1, "num_key_value_heads": 1}
KV_BYTES = 64 << 20  # a small KV cache: several engines live in this process
VLLM_OVERRIDES = ["rollout=vllm", "model.num_attention_heads=1", "model.num_key_value_heads=1",
                  f"rollout.kv_cache_memory_bytes={KV_BYTES}"]


@pytest.fixture(scope="module")
def spec():
    return TinyCharModel(warmstart=None, **VLLM_ARCH)


@pytest.fixture(scope="module")
def engine_and_policy(spec):
    tok = spec.load_tokenizer()
    policy = spec.load_policy()
    engine = VLLMGenerationEngine(stop_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                                  kv_cache_memory_bytes=KV_BYTES)
    engine.sync_weights(policy, 0)
    return engine, policy, tok


def _prompts(tok):
    return [tok("12+34=")["input_ids"]] * 4 + [tok("7*8=")["input_ids"]] * 4


def _trainer_logp(policy, gen, temperature):
    batch = {k: getattr(gen, k) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    return batched_log_probs(policy, batch, temperature, None)


@torch.no_grad()
def perturb_policy(policy):
    """A new policy in place: the tied embedding / lm_head scaled by 4, the last norm shifted by 0.5."""
    policy.model.embed_tokens.weight.mul_(4.0)
    policy.model.norm.weight.add_(0.5)


def assert_resume_at_step4_is_exact(tmp_path, common):
    """Train ``common`` uninterrupted, resume it from ``step4.ckpt`` (a buffer in flight, sampled by the weights of
    step 3), and assert the same completions, weight pushes, final weights, and lag/reward/loss at steps 4 on."""
    from transformers import AutoModelForCausalLM

    from grpolab.app.run import run_training

    full_summary = run_training(compose_train_cfg(tmp_path / "full", common))
    ckpt = tmp_path / "full" / "checkpoints" / "step4.ckpt"
    assert torch.load(ckpt, weights_only=False)["RolloutDataModule"]["in_flight"]["policy_version"] == 3
    summary = run_training(compose_train_cfg(tmp_path / "resumed", [*common, f"ckpt_path={ckpt}"]))
    assert (summary["completions"], summary["weight_syncs"]) == (full_summary["completions"],
                                                                 full_summary["weight_syncs"])
    wa, wb = (AutoModelForCausalLM.from_pretrained(tmp_path / p / "policy").state_dict() for p in ("full", "resumed"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    full, resumed = (pd.read_csv(tmp_path / p / "metrics.csv").dropna(subset=["train/loss"]).reset_index(drop=True)
                     for p in ("full", "resumed"))
    cols = ["train/lag", "train/reward", "train/loss"]
    pd.testing.assert_frame_equal(full[cols].iloc[4:].reset_index(drop=True), resumed[cols])


def assert_lag0_parity(policy, gen, temperature, tol, who):
    """The engine's log-probs of a sampled batch equal the trainer's (max abs difference below ``tol``) on the
    completion tokens, are 0 outside them and negative on them."""
    mask = gen.completion_mask
    diff = ((_trainer_logp(policy, gen, temperature) - gen.sampler_logp).abs() * mask).max()
    assert diff < tol, f"{who} vs trainer log-probs differ by {diff} after a push"
    assert (gen.sampler_logp[~mask] == 0).all() and (gen.sampler_logp[mask] < 0).all()


def test_start_up_check_passed_and_threads_and_rng_are_left_alone(engine_and_policy):
    engine, _, _ = engine_and_policy
    assert engine.weight_pushes == 1
    assert engine.sync_check["mean_abs_logp_difference"] < 1e-5
    torch.set_num_threads(1)  # vLLM replaces it with a no-op in process; the engine puts it back
    assert torch.get_num_threads() == 1


def test_engine_logp_equal_trainer_logp_after_a_push_and_the_push_changes_samples(engine_and_policy):
    engine, policy, tok = engine_and_policy
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    torch.manual_seed(0)
    before = engine.generate(policy, _prompts(tok), params)
    perturb_policy(policy)
    torch.manual_seed(0)
    stale = engine.generate(policy, _prompts(tok), params)
    assert torch.equal(stale.completion_ids, before.completion_ids)  # no push yet: same weights, same seeds
    with pytest.raises(RuntimeError, match="stale"):  # the start-up check catches an engine that missed a push
        check_push(engine, policy)
    pushes = engine.weight_pushes
    engine.sync_weights(policy, 0)
    assert engine.weight_pushes == pushes + 1
    torch.manual_seed(0)
    after = engine.generate(policy, _prompts(tok), params)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    assert_lag0_parity(policy, after, 0.7, 1e-3, "engine")
    # the stale engine's log-probs were those of the old weights, so they differ from the new policy's
    assert ((_trainer_logp(policy, stale, 0.7) - stale.sampler_logp).abs() * stale.completion_mask).max() > 1e-2


def test_generation_masks_seeds_and_greedy(engine_and_policy):
    engine, policy, tok = engine_and_policy
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    torch.manual_seed(3)
    a = engine.generate(policy, _prompts(tok), params)
    torch.manual_seed(3)
    b = engine.generate(policy, _prompts(tok), params)
    assert torch.equal(a.completion_ids, b.completion_ids)  # per-request seeds from torch's RNG
    eos = tok.eos_token_id
    for ids, m, t in zip(a.completion_ids, a.completion_mask, a.truncated):
        n = int(m.sum())
        stopped = bool((ids[:n] == eos).any())
        assert stopped != bool(t)
        if stopped:  # the mask ends at, and includes, the first stop token
            assert int(ids[n - 1]) == eos and (ids[:n - 1] != eos).all()
        else:
            assert n == 10
    greedy = engine.generate(policy, _prompts(tok)[:1], SamplingParams(max_new_tokens=10, do_sample=False))
    assert greedy.sampler_logp is None
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(policy, _prompts(tok)[:1], SamplingParams(max_new_tokens=200))


def test_a_batch_over_the_cpu_prefill_budget_is_sampled_whole(engine_and_policy):
    # 100 distinct prompts of 50 tokens: more than vLLM's CPU budget of 4096 tokens per step, so a chunked prefill
    # would split one; with seeded requests that killed vLLM's CPU engine core ("CPU Generator does not use offset")
    engine, policy, tok = engine_and_policy
    rng = torch.Generator().manual_seed(0)
    prompts = [tok("".join("0123456789+"[int(i)] for i in torch.randint(0, 11, (49,), generator=rng)) + "=")["input_ids"]
               for _ in range(100)]
    assert sum(map(len, prompts)) > 4096
    torch.manual_seed(0)
    gen = engine.generate(policy, prompts, SamplingParams(temperature=1.0, max_new_tokens=4))
    assert gen.completion_ids.shape[0] == 100 and gen.sampler_logp is not None
    assert torch.isfinite(gen.sampler_logp).all()


def test_sampler_state_dict_round_trip(engine_and_policy, spec):
    # what a checkpoint with a buffer in flight stores (rollout.async_generation) and a resumed run restores
    engine, policy, tok = engine_and_policy
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    engine.keep_sampler_state()  # what the asynchronous refresh calls
    engine.sync_weights(policy, 0)
    saved = engine.sampler_state_dict()
    torch.manual_seed(5)
    before = engine.generate(policy, _prompts(tok), params)
    other = spec.load_policy()
    with torch.no_grad():
        other.model.embed_tokens.weight.mul_(-2.0)
    engine.sync_weights(other, 1)
    engine.load_sampler_state_dict(saved, like=policy)
    torch.manual_seed(5)
    after = engine.generate(policy, _prompts(tok), params)
    assert torch.equal(after.completion_ids, before.completion_ids)
    assert torch.allclose(after.sampler_logp, before.sampler_logp)
    engine.keep_sampler_weights = False


def test_bad_knobs_name_the_config_key():
    with pytest.raises(ValueError, match="rollout.gpu_memory_utilization"):
        VLLMGenerationEngine([1], 0, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="rollout.enable_sleep_mode"):
        VLLMGenerationEngine([1], 0, enable_sleep_mode=True)  # not available on CPU


def _fit(tmp_path, *overrides):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *VLLM_OVERRIDES, *overrides])
    parts = build(cfg)
    trainer, module, dm = parts["trainer"], parts["module"], parts["datamodule"]
    if cfg.val.at_start:  # as run_training: validation samples from the live policy, not from the engine
        trainer.validate(module, datamodule=dm, verbose=False)
    trainer.fit(module, datamodule=dm)
    summary = summarize(cfg, parts["algo"], module, dm, 0.0)
    return summary, dm.engine, pd.read_csv(tmp_path / "metrics.csv")


def test_offpolicy_training_pushes_once_per_refresh_and_uses_the_engine_logp(tmp_path):
    steps, k = 7, 3
    summary, engine, metrics = _fit(tmp_path, "algo=grpo_offpolicy", f"algo.steps_per_generation={k}",
                                    f"trainer.max_steps={steps}", "trainer.val_check_interval=100",
                                    "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3")
    refreshes = math.ceil(steps / k)
    assert summary["steps"] == steps
    assert engine.weight_pushes == summary["sampler_refreshes"] == refreshes
    if "weight_syncs" in summary:  # counted around the data module's sync_weights call
        assert summary["weight_syncs"] == refreshes
    train = metrics.dropna(subset=["train/loss"])
    diff = train["train/sampling/sampling_logp_difference/max"]
    lag0 = train["train/lag"] == 0
    # measured on the first use of each lag-0 minibatch only (elsewhere staleness would mix in)
    assert diff[lag0].notna().all() and diff[~lag0].isna().all()
    assert (diff[lag0] < 1e-3).all()
    assert ((train["train/sampling/importance_sampling_ratio/min"][lag0] - 1).abs() < 1e-3).all()
    # log alpha is the engine's: at lag 0 the ratio against it is 1 up to the engine/trainer mismatch
    assert (train["train/ratio/mean"][lag0] - 1).abs().max() < 1e-3
    assert (train["train/tv_token"][~lag0] > 0).all()  # later the policy has moved away from the sampler
    assert metrics["val/accuracy"].notna().any()


def test_a_lora_policy_is_pushed_merged(tmp_path, spec):
    # vLLM loads base checkpoint names: the adapters are folded into the pushed weights (grpolab.lora.
    # merged_state_dict). Pushing PEFT's own names failed inside vLLM; pushing the base alone would sample stale.
    steps, k = 7, 3
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *VLLM_OVERRIDES, "model.lora.r=4", "algo=grpo_offpolicy",
                                       f"algo.steps_per_generation={k}", f"trainer.max_steps={steps}",
                                       "trainer.val_check_interval=100", "val.at_start=false",
                                       "algo.truncated_reward=-1.0", "algo.learning_rate=3e-2"])
    parts = build(cfg)
    module, dm = parts["module"], parts["datamodule"]
    parts["trainer"].fit(module, datamodule=dm)
    engine, policy = dm.engine, module.policy
    assert engine.weight_pushes == math.ceil(steps / k)
    train = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    lag0 = train["train/lag"] == 0
    assert (train["train/sampling/sampling_logp_difference/max"][lag0] < 1e-3).all()
    engine.sync_weights(policy, 0)  # the adapters after training
    gen = engine.generate(policy, _prompts(spec.load_tokenizer()), SamplingParams(temperature=1.0, max_new_tokens=8))
    mask = gen.completion_mask
    assert ((_trainer_logp(policy, gen, 1.0) - gen.sampler_logp).abs() * mask).max() < 1e-3
    with policy.disable_adapter():  # the adapters moved the policy: the base alone would be a stale sampler
        assert ((_trainer_logp(policy, gen, 1.0) - gen.sampler_logp).abs() * mask).max() > 1e-2


def test_recompute_and_importance_sampling_correction_log_every_minibatch(tmp_path):
    _, engine, metrics = _fit(tmp_path, "algo=grpo_offpolicy", "algo.steps_per_generation=2", "trainer.max_steps=4",
                              "trainer.val_check_interval=100", "val.at_start=false",
                              "algo.vllm_importance_sampling_correction=true", "rollout.recompute_sampler_logp=true")
    assert engine.weight_pushes == 2
    train = metrics.dropna(subset=["train/loss"])
    # the trainer's log alpha was recomputed at the refresh, so the mismatch is known at every lag
    assert train["train/sampling/sampling_logp_difference/max"].notna().all()
    assert (train["train/sampling/sampling_logp_difference/max"] < 1e-3).all()
    assert (train["train/sampling/importance_sampling_ratio/max"] <= 3.0).all()


def test_async_generation_with_the_engine_log_probs(tmp_path):
    steps, k = 6, 2
    summary, engine, metrics = _fit(tmp_path, "algo=grpo_offpolicy", f"algo.steps_per_generation={k}",
                                    f"trainer.max_steps={steps}", "trainer.val_check_interval=100", "val.at_start=false",
                                    "rollout.async_generation=true", "algo.truncated_reward=-1.0",
                                    "algo.learning_rate=1e-3")
    train = metrics.dropna(subset=["train/loss"])
    assert train["train/lag"].max() >= k  # buffer r+1 sampled while the trainer trained on buffer r
    assert engine.weight_pushes == summary["weight_syncs"]
    # the engine's log-probs are log alpha in the background too: the policy has moved away from them
    assert (train["train/tv_token"][train["train/lag"] > 0] > 0).all()
    assert train["train/sampling/sampling_logp_difference/max"].dropna().lt(1e-3).all()


def test_async_resume_regenerates_the_buffer_in_flight_exactly(tmp_path):
    # as tests/rollout/test_async.py with rollout=vllm: the checkpoint at step 4 holds buffer 2 in flight, sampled
    # from the weights of step 3; the resumed run pushes the saved weights and regenerates it identically.


    common = [*FAST_OVERRIDES, *VLLM_OVERRIDES, "val.at_start=false", "rollout.async_generation=true",
              "algo=grpo_offpolicy", "algo.steps_per_generation=3", "trainer.max_steps=8",
              "trainer.val_check_interval=100", "callbacks.model_checkpoint.every_n_train_steps=4",
              "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=-1",
              "callbacks.model_checkpoint.filename='step{step}'", "algo.truncated_reward=-1.0",
              "algo.learning_rate=1e-3"]
    assert_resume_at_step4_is_exact(tmp_path, common)
