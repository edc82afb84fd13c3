"""The sampler that owns its weights, and sampling with an explicit generator."""

import pytest
import torch

from grpolab.rollout.engines.base import SamplingParams
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine
from grpolab.rollout.settings import RolloutConfig, split_rollout_config


def _setup(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    policy = tiny_spec.load_policy(None)
    prompts = [tok("12+34=")["input_ids"]] * 6 + [tok("7+5=")["input_ids"]] * 6
    return tok, policy, prompts


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_explicit_generator_draws_what_the_global_rng_draws_and_leaves_it_alone(tiny_spec, temperature):
    tok, policy, prompts = _setup(tiny_spec)
    engine = HFGenerationEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id)
    torch.manual_seed(3)
    a = engine.generate(policy, prompts, SamplingParams(temperature=temperature, max_new_tokens=10,
                                                        return_log_probs=True))
    torch.manual_seed(11)
    before = torch.get_rng_state()
    b = engine.generate(policy, prompts, SamplingParams(temperature=temperature, max_new_tokens=10,
                                                        return_log_probs=True,
                                                        generator=torch.Generator().manual_seed(3)))
    assert torch.equal(torch.get_rng_state(), before)  # the trainer's RNG is untouched
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    # the engine's log-probs of the drawn tokens are those of the distribution sampled from, on both paths
    assert b.sampler_logp.shape == a.sampler_logp.shape and torch.allclose(a.sampler_logp, b.sampler_logp, atol=1e-6)
    assert (b.sampler_logp[b.completion_mask] < 0).all()


def test_copy_engine_samples_from_its_copy_until_the_next_push(tiny_spec):
    tok, policy, prompts = _setup(tiny_spec)
    engine = HFSamplerCopyEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id)
    assert engine.owns_weights and not HFGenerationEngine.owns_weights
    with pytest.raises(RuntimeError, match="sync_weights"):
        engine.generate(policy, prompts, SamplingParams(max_new_tokens=4))
    engine.sync_weights(policy, 0)
    params = SamplingParams(max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    first = engine.generate(policy, prompts, params)
    with torch.no_grad():  # the trainer moves the live policy a lot
        for p in policy.parameters():
            p.add_(torch.randn_like(p))
    params.generator.manual_seed(0)
    assert torch.equal(engine.generate(policy, prompts, params).completion_ids, first.completion_ids)
    engine.sync_weights(policy, 0)  # the push: the copy now equals the policy, and is still a separate module
    assert engine.sampler_model is not policy
    live = engine.validation_engine()
    params.generator.manual_seed(0)
    pushed = engine.generate(policy, prompts, params)
    params.generator.manual_seed(0)
    assert torch.equal(pushed.completion_ids, live.generate(policy, prompts, params).completion_ids)
    state = engine.sampler_state_dict()
    other = HFSamplerCopyEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id)
    other.load_sampler_state_dict(state, like=tiny_spec.load_policy(None))
    assert all(torch.equal(v, other.sampler_model.state_dict()[k]) for k, v in state.items())


def test_rollout_settings_split_and_validate():
    from grpolab.config import GRPOConfig

    args, settings = split_rollout_config({"_target_": "x", "generation_batch_size": None,
                                           "async_generation": True, "max_lag": 25})
    assert args == {"_target_": "x", "generation_batch_size": None}
    k10 = GRPOConfig(steps_per_generation=10)
    assert settings.validate(k10, HFSamplerCopyEngine).schedule(k10).push_delay() == 0  # 2k-1 = 19 <= 25: full overlap
    assert RolloutConfig(True, 14).schedule(k10).push_delay() == 5  # lags 10-5 .. 19-5
    assert RolloutConfig(True, 9).schedule(k10).push_delay() == 10  # no overlap: lags 0..9
    with pytest.raises(ValueError, match="rollout.async_generation"):  # the in-place engine owns no weights
        RolloutConfig(async_generation=True).validate(k10, HFGenerationEngine)
    RolloutConfig(async_generation=True).validate(k10, HFSamplerCopyEngine)
    with pytest.raises(ValueError, match="rollout.max_lag"):
        RolloutConfig(max_lag=8).validate(k10, HFSamplerCopyEngine)
    with pytest.raises(ValueError, match="rollout.generation_timeout_s"):
        RolloutConfig(generation_timeout_s=0).validate(k10, HFSamplerCopyEngine)


def test_an_engine_that_owns_weights_must_checkpoint_them():
    # async resume regenerates a buffer in flight from the sampler's saved weights: an engine that owns weights
    # without a way to save and restore them is refused when its class is defined, not mid-run
    with pytest.raises(TypeError, match="sampler_state_dict"):
        class _NoState(HFGenerationEngine):
            owns_weights = True

            def sync_weights(self, model, version):
                pass


@pytest.mark.parametrize("engine_cls,recompute,from_engine", [(HFSamplerCopyEngine, None, True),
                                                              (HFSamplerCopyEngine, True, False),
                                                              (HFGenerationEngine, None, False)])
def test_log_alpha_is_recorded_while_sampling_unless_recomputed(tiny_spec, arithmetic_task, exact_reward,
                                                                engine_cls, recompute, from_engine):
    # hf_copy (as a separate inference engine) keeps the log-probs of the sampled tokens as log alpha: no
    # forward over the buffer; they equal the trainer's forward of the sampler's weights to float32 round-off.
    # The in-place engine recomputes by default (lag-0 ratio exactly 1).
    from grpolab.config import GRPOConfig
    from grpolab.forward.logprob_pass import batched_log_probs
    from grpolab.rollout.producer import RolloutProducer

    tok = tiny_spec.load_tokenizer()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=8, max_completion_length=12,
                     steps_per_generation=2, temperature=0.7)
    kwargs = {} if recompute is None else {"recompute_sampler_logp": recompute}
    engine = engine_cls(tiny_spec.stop_token_ids(tok), tok.pad_token_id, **kwargs)
    policy = tiny_spec.load_policy(None)
    engine.sync_weights(policy, 0)
    producer = RolloutProducer(cfg, arithmetic_task, tok, engine, exact_reward)
    producer.needs_sampler_logp = True
    mbs = producer.produce(policy, None, arithmetic_task.splits()["train"][:4], 0, 0,
                           torch.Generator().manual_seed(0))
    for mb in mbs:
        assert mb.sampler_logp_from_engine is from_engine and (mb.engine_logp is not None) is from_engine
        trainer = batched_log_probs(policy, mb.tensors(), cfg.temperature, cfg.micro_batch_size,
                                    cfg.shared_prompt_forward)
        m = mb.completion_mask
        assert m.sum() > 8
        if from_engine:
            assert (mb.sampler_logp[~m] == 0).all() and (mb.sampler_logp - trainer)[m].abs().max() < 1e-5
        else:
            assert torch.equal(mb.sampler_logp, trainer)


def test_recompute_sampler_logp_must_be_a_boolean(tiny_spec):
    tok = tiny_spec.load_tokenizer()
    with pytest.raises(ValueError, match="rollout.recompute_sampler_logp must be true or false"):
        HFSamplerCopyEngine(tiny_spec.stop_token_ids(tok), tok.pad_token_id, recompute_sampler_logp="no")
