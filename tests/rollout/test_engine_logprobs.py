"""An engine that reports its own log-probs (as vLLM does): the producer stores them as log alpha without a trainer
forward, or recomputes log alpha on request, and the module measures the mismatch only where it is not staleness.

The engine here is the real Hugging Face engine whose report is the trainer's log-probs shifted by a known offset,
so the mismatch has a known value; the vLLM engine itself is tested in tests/vllm_extra (second environment).
"""

import importlib.util
import math

import pytest
import torch
from conftest import FAST_OVERRIDES, compose_train_cfg

from grpolab.algo.sampling_correction import first_use_mismatch
from grpolab.config import GRPOConfig
from grpolab.forward.logprob_pass import batched_log_probs
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.producer import RolloutProducer

OFFSET = 0.1


class ShiftedLogpEngine(HFGenerationEngine):
    """Hugging Face generate + a log-prob report that is off by OFFSET nats per token."""

    recompute_sampler_logp = False

    def generate(self, model, prompts, params):
        gen = super().generate(model, prompts, params)
        batch = {k: getattr(gen, k) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        gen.sampler_logp = (batched_log_probs(model, batch, params.temperature, None) - OFFSET) * gen.completion_mask
        return gen


def _produce(spec, task, reward, recompute=False, **algo):
    tok = spec.load_tokenizer()
    cfg = GRPOConfig(**{"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 4,
                        "steps_per_generation": 2, **algo})
    engine = ShiftedLogpEngine(spec.stop_token_ids(tok), tok.pad_token_id)
    engine.recompute_sampler_logp = recompute
    policy = spec.load_policy()
    torch.manual_seed(0)
    mbs = RolloutProducer(cfg, task, tok, engine, reward).produce(policy, None, task.splits()["train"][:4], 0, 0)
    return cfg, policy, mbs


def test_engine_logp_is_log_alpha_without_recompute(tiny_spec, arithmetic_task, exact_reward):
    cfg, policy, mbs = _produce(tiny_spec, arithmetic_task, exact_reward)
    for mb in mbs:
        assert mb.sampler_logp_from_engine and torch.equal(mb.sampler_logp, mb.engine_logp)
        trainer = batched_log_probs(policy, mb.tensors(), cfg.temperature, None)
        m = mb.completion_mask
        assert torch.allclose((trainer - mb.engine_logp)[m], torch.full_like(trainer[m], OFFSET), atol=1e-5)
        assert mb.engine_logp.shape == mb.completion_ids.shape  # trimmed with the completions


@pytest.mark.parametrize("algo", [{}, {"vllm_importance_sampling_correction": True}])
def test_recompute_keeps_both(tiny_spec, arithmetic_task, exact_reward, algo):
    recompute = not algo  # the correction alone also forces the trainer's log alpha (TRL)
    cfg, policy, mbs = _produce(tiny_spec, arithmetic_task, exact_reward, recompute=recompute, **algo)
    for mb in mbs:
        assert not mb.sampler_logp_from_engine
        trainer = batched_log_probs(policy, mb.tensors(), cfg.temperature, None)
        assert torch.allclose(mb.sampler_logp, trainer)
        # known at every lag, since the trainer's log alpha is of the sampler's own weights
        m = first_use_mismatch(mb, trainer, mb.index, cfg)
        assert m["sampling/sampling_logp_difference/mean"] == pytest.approx(OFFSET, abs=1e-5)
        cap = 3.0 if algo else math.inf
        assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx(min(math.exp(OFFSET), cap), rel=1e-5)


def test_mismatch_is_measured_at_lag_zero_only_without_recompute(tiny_spec, arithmetic_task, exact_reward):
    cfg, policy, mbs = _produce(tiny_spec, arithmetic_task, exact_reward)
    lag0, lag1 = mbs
    current = batched_log_probs(policy, lag0.tensors(), cfg.temperature, None)
    m = first_use_mismatch(lag0, current, lag0.policy_version, cfg)
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(OFFSET, abs=1e-5)
    later = first_use_mismatch(lag1, current, lag1.policy_version + 1, cfg)
    assert set(later) == set(m) and all(math.isnan(v) for v in later.values())  # staleness would mix in


def test_rollout_vllm_without_vllm_names_the_install_command(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    from grpolab.app.run import build

    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "rollout=vllm"])
    with pytest.raises(Exception, match=r'pip install -e "\.\[vllm\]"') as err:  # Hydra wraps the ImportError
        build(cfg)
    assert isinstance(err.value, ImportError) or isinstance(err.value.__cause__, ImportError)
    # from the config alone, before any model is built
    from omegaconf import OmegaConf

    from grpolab.config import GRPOConfig
    from grpolab.rollout.settings import resolve_rollout

    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"'):
        resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True),
                        GRPOConfig.from_dict(OmegaConf.to_container(cfg.algo, resolve=True)))


def test_correction_without_an_engine_that_reports_log_probs_is_an_error(tmp_path):
    from grpolab.app.run import build

    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "algo.vllm_importance_sampling_correction=true"])
    with pytest.raises(ValueError, match="algo.vllm_importance_sampling_correction"):
        build(cfg)


def test_async_vllm_refuses_a_recomputed_log_alpha(tmp_path):
    # checked from the config alone (vLLM need not be installed): a background buffer has no trainer-side copy
    # of the sampler's weights to recompute log alpha with
    from omegaconf import OmegaConf

    from grpolab.config import GRPOConfig
    from grpolab.rollout.settings import resolve_rollout

    for extra in (["rollout.recompute_sampler_logp=true"], ["algo.vllm_importance_sampling_correction=true"]):
        cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "rollout=vllm", "algo=grpo_offpolicy",
                                           "rollout.async_generation=true", *extra])
        algo = GRPOConfig.from_dict(dict(cfg.algo))
        with pytest.raises(ValueError, match="rollout.async_generation=true with VLLMGenerationEngine"):
            resolve_rollout(OmegaConf.to_container(cfg.rollout, resolve=True), algo)
