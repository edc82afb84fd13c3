"""grpolab.distributed helpers (one process), bf16 autocast with fp32 log-probs and loss, and gradient
checkpointing on the policy."""

import pytest
import torch
from certain_reward import varied
from conftest import TINY_ARCH
from omegaconf import OmegaConf

from grpolab.algo.aggregation import step_denominator
from grpolab.algo.losses import LossConfig, grpo_loss
from grpolab.distributed import check_devices, check_trainer, iter_full_parameters
from grpolab.forward.logprob_pass import completion_log_probs
from grpolab.models import TinyCharModel


def _batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(3, 20, (4, 5), generator=g), torch.ones(4, 5), torch.randint(3, 20, (4, 6), generator=g),
            torch.ones(4, 6, dtype=torch.bool))


def test_iter_full_parameters_yields_every_parameter_once_by_name():
    model = TinyCharModel(warmstart=None, **TINY_ARCH).load_policy()
    got = dict(iter_full_parameters(model))
    expected = dict(model.named_parameters())  # tied lm_head/embeddings appear once
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in got
    assert any(k.endswith("inv_freq") for k, _ in iter_full_parameters(model, include_buffers=True))


def test_step_denominator_single_rank_is_the_local_one():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert step_denominator(mask, "dapo", None) == 3.0
    assert step_denominator(mask, "dapo", None, 2, lambda x: x * 2) == 3.0  # sum over 2 ranks / 2
    assert step_denominator(mask, "bnpo", None, 2, lambda x: 1e9) == 3.0  # per rank, never reduced
    with pytest.raises(ValueError, match="sum_over_ranks"):
        step_denominator(mask, "dapo", None, 2)


@pytest.mark.parametrize("accelerator,devices,match", [("cpu", 4096, r"trainer\.devices=4096 CPU"),
                                                       ("gpu", 2 + torch.cuda.device_count(), r"trainer\.devices=.*GPU"),
                                                       ("cpu", 0, r"trainer\.devices must be")])
def test_too_many_devices_name_trainer_devices(accelerator, devices, match):
    with pytest.raises(ValueError, match=match):
        check_devices(accelerator, devices)


def test_deepspeed_without_the_package_says_what_to_use_instead():
    pytest.importorskip("lightning")
    try:
        import deepspeed  # noqa: F401
        pytest.skip("deepspeed is installed")
    except ImportError:
        pass
    cfg = OmegaConf.create({"accelerator": "gpu", "devices": "auto",
                            "strategy": {"_target_": "lightning.pytorch.strategies.DeepSpeedStrategy"}})
    with pytest.raises(ValueError, match=r"trainer=deepspeed needs the deepspeed package.*trainer=fsdp"):
        check_trainer(cfg)


def test_fsdp_with_lora_export_is_rejected_early():
    cfg = OmegaConf.create({"accelerator": "cpu", "devices": 2,
                            "strategy": {"_target_": "lightning.pytorch.strategies.ModelParallelStrategy"}})
    check_trainer(cfg)  # FSDP2 itself runs on this CPU (gloo)
    with pytest.raises(ValueError, match=r"trainer=fsdp with model\.lora\.r.*trainer=ddp"):
        check_trainer(cfg, export_lora=True)
    from grpolab.rollout.engines.hf import HFGenerationEngine
    from grpolab.rollout.engines.hf_copy import HFSamplerCopyEngine

    with pytest.raises(ValueError, match=r"trainer=fsdp cannot be used with HFSamplerCopyEngine.*rollout=hf"):
        check_trainer(cfg, engine=HFSamplerCopyEngine)  # a sampler copy of a sharded policy
    check_trainer(cfg, engine=HFGenerationEngine)


def test_bf16_autocast_keeps_log_probs_and_loss_in_fp32():
    model = TinyCharModel(warmstart=None, **TINY_ARCH).load_policy()
    p, pm, c, cm = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = completion_log_probs(model, p, pm, c, cm, 0.7)
        loss, _ = grpo_loss(logp, logp.detach(), logp.detach(), torch.randn(4), cm,
                            LossConfig(beta=0.04), 24.0, ref_logp=logp.detach() - 0.1)
    assert logp.dtype == torch.float32 and loss.dtype == torch.float32
    ref, _ = completion_log_probs(model, p, pm, c, cm, 0.7)
    assert not torch.equal(logp, ref)  # the forward did run in bf16 ...
    torch.testing.assert_close(logp, ref, atol=0.1, rtol=0)  # ... close to fp32
    loss.backward()
    assert all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)


def test_gradient_checkpointing_gives_the_same_gradient():
    grads = []
    for gc in (False, True):
        model = TinyCharModel(warmstart=None, gradient_checkpointing=gc, **TINY_ARCH).load_policy()
        model.train()
        assert getattr(model, "is_activation_checkpointing", model.is_gradient_checkpointing) == gc
        logp, _ = completion_log_probs(model, *_batch(), 1.0)
        logp.sum().backward()
        grads.append(torch.cat([q.grad.flatten() for q in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_bf16_mixed_run_samples_in_the_training_precision(tmp_path):
    # The sampler's log-probs are computed under the same Lightning autocast as the training forward, so the
    # off-policy ratio at lag 0 is exactly 1 (with an fp32 sampler it drifts by ~1e-3 in bf16).
    import pandas as pd
    from conftest import FAST_OVERRIDES, compose_train_cfg

    from grpolab.app.run import run_training

    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, "trainer.precision=bf16-mixed", "algo=grpo_offpolicy",
                                       "algo.steps_per_generation=2", *varied(),
                                       "trainer.max_steps=3", "val.at_start=false", "model.gradient_checkpointing=true"])
    run_training(cfg)
    train = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    lag0 = train[train["train/lag"] == 0]
    assert len(lag0) == 2 and (lag0["train/ratio/max"] == 1.0).all() and (lag0["train/ratio/min"] == 1.0).all()
    assert (train["train/loss"].abs() > 0).any()
