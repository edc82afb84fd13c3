"""Sampler and reference passes skip rows the masks removed, and the loss and gradients do not change."""

import torch

from grpolab.algo.losses import grpo_loss, loss_denominator
from grpolab.config import GRPOConfig
from grpolab.models import make_reference
from grpolab.rollout.engine import HFGenerationEngine
from grpolab.rollout.forward import batched_log_probs, completion_log_probs
from grpolab.rollout.producer import RolloutProducer


def test_masked_rows_skip_the_sampler_and_reference_passes(tiny_spec, arithmetic_task, exact_reward):
    tok = tiny_spec.load_tokenizer()
    # truncated_reward=-1 gives the random model reward variance (stopped vs never stopped) in some groups.
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=16, max_completion_length=4,
                     steps_per_generation=2, beta=0.04, mask_zero_std_groups=True, truncated_reward=-1.0)
    producer = RolloutProducer(cfg, arithmetic_task, tok, HFGenerationEngine([tok.eos_token_id], tok.pad_token_id),
                               exact_reward)
    policy = tiny_spec.load_policy()
    reference = make_reference(policy)
    torch.manual_seed(3)
    mbs = producer.produce(policy, reference, arithmetic_task.splits()["train"][:8], round_index=0, policy_version=0)
    needed = torch.cat([mb.loss_mask.bool().any(1) for mb in mbs])
    assert needed.any() and not needed.all(), "the seed must give both masked and unmasked groups"
    for mb in mbs:
        keep = mb.loss_mask.bool().any(1)
        for model, got in ((policy, mb.sampler_logp), (reference, mb.ref_logp)):
            full = batched_log_probs(model, mb.tensors(), cfg.temperature, None)
            assert torch.equal(got[~keep], torch.zeros_like(got[~keep]))  # not computed
            assert torch.allclose(got[keep], full[keep], atol=1e-6)
            # The loss and its gradient are the same as with every row computed.
            results = []
            for sampler in (got, full):
                policy.zero_grad(set_to_none=True)
                logp, _ = completion_log_probs(policy, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                               mb.completion_mask, cfg.temperature)
                denominator = loss_denominator(mb.loss_mask, cfg.loss_type, cfg.max_completion_length)
                loss, _ = grpo_loss(logp, sampler, logp.detach(), mb.advantages, mb.loss_mask, cfg.loss_config(),
                                    denominator, got if model is reference else full)
                loss.backward()
                results.append((loss.detach(), [p.grad.clone() for p in policy.parameters()]))
            # Same to fp32 round-off (a smaller batch changes the matmul blocking, not the maths).
            assert torch.allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-7)
            assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7)
                       for a, b in zip(results[0][1], results[1][1], strict=True))
