"""model.lora.dropout > 0 keeps PEFT's lora_dropout on in the training forward (it is added after
disable_dropout): a warning says so, and the forwards below show that what it says is true."""

import logging

import pytest
import torch
from conftest import TINY_ARCH

from grpolab.forward.logprob_pass import batched_log_probs, completion_log_probs
from grpolab.models import TinyCharModel


def _policy(dropout: float) -> torch.nn.Module:
    policy = TinyCharModel(warmstart=None, lora={"r": 4, "dropout": dropout}, **TINY_ARCH).load_policy()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # trained adapters: PEFT starts lora_B at 0, where the adapter path adds nothing
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return policy


def _lag0_log_ratio(policy: torch.nn.Module) -> torch.Tensor:
    """Training forward (train mode) minus the sampler's pass (eval mode) on the same weights: 0 when on-policy."""
    g = torch.Generator().manual_seed(0)
    batch = {"prompt_ids": torch.randint(3, 20, (4, 5), generator=g), "prompt_mask": torch.ones(4, 5),
             "completion_ids": torch.randint(3, 20, (4, 6), generator=g), "completion_mask": torch.ones(4, 6)}
    sampler = batched_log_probs(policy, batch, 1.0, None)
    policy.train()
    torch.manual_seed(0)
    logp, _ = completion_log_probs(policy, *batch.values(), 1.0)
    return logp.detach() - sampler


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_lora_dropout_warns_and_moves_the_lag0_ratio(caplog, dropout):
    with caplog.at_level(logging.WARNING, logger="grpolab.lora"):
        policy = _policy(dropout)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "model.lora.dropout" in r.getMessage()]
    log_ratio = _lag0_log_ratio(policy)
    if dropout == 0:
        assert warnings == []
        assert torch.equal(log_ratio, torch.zeros_like(log_ratio))  # lag-0 ratio exactly 1
    else:
        assert len(warnings) == 1 and "lag-0 importance ratio is not 1" in warnings[0].getMessage()
        assert log_ratio.abs().max() > 1e-3  # the warning's claim: the ratio moves away from 1
