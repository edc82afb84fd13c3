"""algo.ratio_reference=previous: the ratio is pi_theta / pi_{t-1} token-wise, on a real tiny model whose previous
weights come from grpolab.previous_policy, checked against an independent copy of the old model; 1 (nothing
clipped) before any previous policy exists; bad settings name the key."""

import copy

import pytest
import torch

from grpolab.algo import grpo_loss
from grpolab.algo.loss_config import LossConfig
from grpolab.algo.policy_loss import PolicyLossInputs, importance_ratios
from grpolab.errors import ConfigError
from grpolab.forward.logprob_pass import completion_log_probs
from grpolab.previous_policy import PreviousPolicy


def _batch(tok):
    prompts = ["12+34=", "7+8=", "50+50=", "3+4="]
    completions = ["46\n", "15\n", "100\n", "7\n"]
    enc = tok(prompts, return_tensors="pt", padding=True)
    comp = tok(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"], comp["input_ids"], comp["attention_mask"]


def _logp(model, batch):
    with torch.no_grad():
        return completion_log_probs(model, *batch, temperature=1.0)[0]


def _sgd_step(model, batch, lr=0.5):
    """One plain gradient step that moves the policy (maximise the completions' log-likelihood)."""
    logp = completion_log_probs(model, *batch, temperature=1.0)[0]
    (-(logp * batch[3]).sum()).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None


def test_previous_log_probs_are_those_of_the_policy_before_the_step(tiny_spec, arithmetic_task):
    policy = tiny_spec.load_policy(arithmetic_task)
    batch = _batch(tiny_spec.load_tokenizer())
    prev = PreviousPolicy(policy)
    old_model = copy.deepcopy(policy)  # the independent truth: a second model holding pi_{t-1}
    prev.snapshot(policy)  # what the module does right before optimizer.step()
    _sgd_step(policy, batch)
    params_before = [p for p in policy.parameters()]
    values_before = [p.detach().clone() for p in policy.parameters()]

    got = prev.log_probs(policy, lambda m: completion_log_probs(m, *batch, temperature=1.0)[0])
    mask = batch[3].bool()
    torch.testing.assert_close(got[mask], _logp(old_model, batch)[mask], rtol=0, atol=1e-6)
    # the swap put the live weights back: same Parameter objects, same values, and they still get gradients
    assert all(a is b for a, b in zip(policy.parameters(), params_before, strict=True))
    assert all(torch.equal(p, v) for p, v in zip(policy.parameters(), values_before, strict=True))
    current = completion_log_probs(policy, *batch, temperature=1.0)[0]
    assert current.requires_grad and not torch.allclose(current[mask], got[mask])

    # the loss's ratio is pi_theta / pi_{t-1} token-wise
    cfg = LossConfig(ratio_reference="previous", clip_mode="ppo", epsilon=0.2)
    zeros = torch.zeros_like(current)
    inp = PolicyLossInputs(logp=torch.where(mask, current, zeros), sampler_logp=torch.where(mask, current.detach(), zeros),
                           anchor_logp=torch.where(mask, current.detach(), zeros), advantages=torch.ones(4, 1),
                           mask=mask, previous_logp=torch.where(mask, got, zeros))
    ratio = importance_ratios(inp, cfg).ratio
    torch.testing.assert_close(ratio[mask], (current - got).exp()[mask].detach(), rtol=1e-6, atol=0)
    assert ratio.requires_grad

    # grpo_loss: the clip statistics count the tokens outside [0.8, 1.2] on the side the advantage pushes
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, stats = grpo_loss(current, current.detach(), current.detach(), adv, mask, cfg, float(mask.sum()),
                            previous_logp=got)
    r = (current.detach() - got).exp()
    high = mask & (r > 1.2) & (adv[:, None] > 0)
    low = mask & (r < 0.8) & (adv[:, None] < 0)
    assert float(stats["clip_high_sum"]) == float(high.sum()) and float(stats["clip_low_sum"]) == float(low.sum())
    assert float(stats["clip_region_sum"]) > 0  # the step moved the policy far enough for the window to bind
    torch.testing.assert_close(stats["ratio_sum"], r[mask].sum())
    loss.backward()  # and its gradient flows to the live policy
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


def test_before_any_step_the_previous_policy_is_the_current_one(tiny_spec, arithmetic_task):
    policy = tiny_spec.load_policy(arithmetic_task)
    batch = _batch(tiny_spec.load_tokenizer())
    prev = PreviousPolicy(policy)  # step 0: no snapshot yet, pi_{-1} := pi_0
    got = prev.log_probs(policy, lambda m: completion_log_probs(m, *batch, temperature=1.0)[0])
    current = completion_log_probs(policy, *batch, temperature=1.0)[0]
    mask = batch[3].bool()
    cfg = LossConfig(ratio_reference="previous", clip_mode="ppo")
    _, stats = grpo_loss(current, current.detach(), current.detach(), torch.tensor([1.0, -1.0, 1.0, -1.0]), mask,
                         cfg, float(mask.sum()), previous_logp=got)
    assert float(stats["ratio_max"]) == 1.0 and float(stats["ratio_min"]) == 1.0
    assert float(stats["clip_region_sum"]) == 0.0


def test_state_dict_round_trip_restores_the_previous_weights(tiny_spec, arithmetic_task):
    policy = tiny_spec.load_policy(arithmetic_task)
    batch = _batch(tiny_spec.load_tokenizer())
    prev = PreviousPolicy(policy)
    prev.snapshot(policy)
    state = prev.state_dict()
    _sgd_step(policy, batch)
    other = PreviousPolicy(policy)
    other.load_state_dict(state, policy)
    assert all(torch.equal(a, b) for a, b in zip(prev.tensors, other.tensors, strict=True))
    with pytest.raises(ValueError, match="ratio_reference=previous"):
        other.load_state_dict({"names": ["not.a.parameter"], "tensors": None}, policy)


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="algo.clip_mode=ppo"):
        LossConfig(ratio_reference="previous", clip_mode="offpolicy_grpo")
    with pytest.raises(ConfigError, match="algo.ratio_reference"):
        LossConfig(ratio_reference="previous", clip_mode="decoupled_ppo")
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="previous_logp"):
        grpo_loss(x, x, x, torch.zeros(1), torch.ones(1, 2, dtype=torch.bool),
                  LossConfig(ratio_reference="previous"), 2.0)
