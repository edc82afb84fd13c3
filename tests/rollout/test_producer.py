"""Rollout production: groups by uid, gold answers aligned with completions, reward policies, masks."""

import math

import pytest
import torch

from grpolab.config import GRPOConfig
from grpolab.rollout.engines.hf import HFGenerationEngine
from grpolab.rollout.producer import RolloutProducer


def _producer(spec, task, reward, **algo):
    tok = spec.load_tokenizer()
    cfg = GRPOConfig(**{"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 4, **algo})
    return RolloutProducer(cfg, task, tok, HFGenerationEngine(spec.stop_token_ids(tok), tok.pad_token_id), reward)


def test_groups_and_gold_answers_stay_aligned(tiny_spec, arithmetic_task, exact_reward):
    prod = _producer(tiny_spec, arithmetic_task, exact_reward, steps_per_generation=3)
    rows = arithmetic_task.splits()["train"][:6]
    torch.manual_seed(0)
    mbs = prod.produce(tiny_spec.load_policy(), None, rows, round_index=0, policy_version=0)
    assert len(mbs) == 3 and [mb.index for mb in mbs] == [0, 1, 2]
    for mb in mbs:
        assert len(mb) == 8
        info = mb.info
        for prompt, answer, uid in zip(info["prompts"], info["answers"], info["uids"]):
            a, b = prompt.rstrip("=").split("+")
            assert answer == str(int(a) + int(b)) and uid == f"arith/{a}+{b}"
        # one group id per uid, num_generations rows each
        for gid in mb.group_ids.unique():
            members = [u for u, g in zip(info["uids"], mb.group_ids.tolist()) if g == gid]
            assert len(members) == 4 and len(set(members)) == 1


def test_truncated_reward_policy_and_masks(tiny_spec, arithmetic_task, exact_reward):
    # A random model with 1 new token almost never stops: every completion is truncated.
    rows = arithmetic_task.splits()["train"][:2]
    prod = _producer(tiny_spec, arithmetic_task, exact_reward, max_completion_length=1, truncated_reward=-1.0,
                     mask_truncated_completions=True)
    torch.manual_seed(0)
    (mb,) = prod.produce(tiny_spec.load_policy(), None, rows, 0, 0)
    trunc = mb.truncated
    assert trunc.any()
    assert torch.all(mb.rewards[trunc] == -1.0)
    assert torch.all(mb.loss_mask[trunc] == 0)  # mask_truncated_completions drops them from the loss
    assert prod.counters["truncated"] == int(trunc.sum())


def test_unscorable_rows_leave_loss_and_baseline(tiny_spec, arithmetic_task):
    # A verifier that cannot score odd gold answers returns None: those rows get NaN reward, zero advantage
    # and no loss, and they do not move their group's baseline.
    class HalfScorable:
        name = "half"

        def __call__(self, completions, answer, **kw):
            return [None if int(a) % 2 else 1.0 for a in answer]

    from grpolab.verifiers.reward import Verifier

    prod = _producer(tiny_spec, arithmetic_task, Verifier({"half": HalfScorable()}), truncated_reward=None)
    torch.manual_seed(0)
    train = arithmetic_task.splits()["train"]
    rows = [next(r for r in train if int(r["answer"]) % 2), next(r for r in train if not int(r["answer"]) % 2)]
    (mb,) = prod.produce(tiny_spec.load_policy(), None, rows, 0, 0)
    odd = torch.tensor([int(a) % 2 == 1 for a in mb.info["answers"]])
    assert int(odd.sum()) == 4
    assert torch.isnan(mb.rewards[odd]).all() and (mb.rewards[~odd] == 1.0).all()
    assert torch.all(mb.advantages == 0) and torch.all(mb.loss_mask[odd] == 0)
    assert prod.counters["unscorable"] == int(odd.sum())


@pytest.mark.parametrize("k,i,needs_sampler", [(1, 1, False), (4, 1, True), (1, 3, True)])
def test_sampler_log_probs_only_when_needed(tiny_spec, arithmetic_task, exact_reward, k, i, needs_sampler):
    # With k = 1 and num_iterations = 1 no extra forward pass computes old log-probs (TRL behaviour).
    prod = _producer(tiny_spec, arithmetic_task, exact_reward, steps_per_generation=k, num_iterations=i, beta=0.1)
    policy = tiny_spec.load_policy()
    mbs = prod.produce(policy, policy, arithmetic_task.splits()["train"][: 2 * k], 0, 0)
    for mb in mbs:
        assert (mb.sampler_logp is not None) == needs_sampler
        assert mb.ref_logp is not None and mb.ref_logp.shape == mb.completion_ids.shape
        if needs_sampler:  # the reference is the same weights here, so both log-probs agree
            assert torch.allclose(mb.sampler_logp, mb.ref_logp)
            assert math.isfinite(float(mb.sampler_logp[mb.completion_mask].sum()))


def test_truncated_rows_leave_the_baseline_with_mask_truncated_completions(tiny_spec, arithmetic_task):
    # Every completion that stops scores 1, every truncated one gets truncated_reward 0. Groups mix the two
    # (fixed seed, 8 new tokens). With the truncated rows out of the loss, the rest of each group is all 1:
    # zero variance, every advantage 0. Leaving them in the baseline (the bug) gives positive advantages.
    class Always:
        name = "always"

        def __call__(self, completions, **kw):
            return [1.0] * len(completions)

    from grpolab.verifiers.reward import Verifier

    prod = _producer(tiny_spec, arithmetic_task, Verifier({"always": Always()}), max_completion_length=8,
                     num_generations=4, per_device_train_batch_size=16, mask_truncated_completions=True,
                     scale_rewards="none")
    torch.manual_seed(0)
    (mb,) = prod.produce(tiny_spec.load_policy(), None, arithmetic_task.splits()["train"][:4], 0, 0)
    mixed = [g for g in mb.group_ids.unique() if 0 < int(mb.truncated[mb.group_ids == g].sum()) < 4]
    assert mixed, "the seed must give a group with both truncated and stopped completions"
    assert torch.equal(mb.advantages, torch.zeros(16)) and bool(mb.zero_std.all())
    assert torch.all(mb.loss_mask[mb.truncated] == 0) and torch.all(mb.rewards[mb.truncated] == 0.0)
